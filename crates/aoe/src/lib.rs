//! ATA over Ethernet (r11) wire format, ATA command set and target/initiator state machines; no sockets
