//! NVMe command set, NVMe/TCP PDUs and controller logic; no sockets
