//! SCSI disk emulation (SPC/SBC) over a Volume; transport independent, no sockets
