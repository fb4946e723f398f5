//! Network drivers: AF_PACKET sockets with batched receive/send, TCP helpers
