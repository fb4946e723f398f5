//! iSCSI (RFC 7143) PDUs, login negotiation, CHAP and session logic; no sockets
