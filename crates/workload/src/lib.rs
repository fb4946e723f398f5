//! Client workloads.
