//! A [`BlockClient`] that reconnects by URL after the connection fails.
//!
//! A request that fails because the target went away fails (the caller sees
//! EIO); the broken client is dropped, and the next request connects again.
//! So I/O resumes by itself once the target is back (iSCSI re-login, NVMe/TCP
//! re-connect, AoE re-discovery are each just `connect` again).

use async_trait::async_trait;
use bw_initiator::{BlockClient, ClientError, ConnectOptions, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The initiator for `url`, or the measuring null volume for `null://SIZE`.
async fn connect_url(url: &str, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    if url.starts_with(crate::null::SCHEME) {
        return Ok(Arc::new(crate::null::NullClient::parse(url)?));
    }
    bw_initiator::connect(url, opts).await
}

pub struct Reconnecting {
    url: String,
    opts: ConnectOptions,
    size: u64,
    block_size: u32,
    describe: String,
    current: Mutex<Option<Arc<dyn BlockClient>>>,
    /// One reconnect at a time; requests arriving meanwhile wait for it.
    connecting: tokio::sync::Mutex<()>,
    /// Failed reconnect attempts so far. A request that waited while an
    /// attempt failed fails too instead of trying again: with the target
    /// unreachable, 32 queued requests must not wait 32 timeouts in turn.
    failures: AtomicU64,
}

impl Reconnecting {
    /// Connect once (errors here are the user's: wrong URL, refused login).
    pub async fn connect(url: &str, opts: ConnectOptions) -> Result<Reconnecting> {
        let client = connect_url(url, &opts).await?;
        Ok(Reconnecting {
            url: url.to_string(),
            size: client.size_bytes(),
            block_size: client.block_size(),
            describe: client.describe(),
            opts,
            current: Mutex::new(Some(client)),
            connecting: tokio::sync::Mutex::new(()),
            failures: AtomicU64::new(0),
        })
    }

    /// False from a broken connection until a reconnect succeeds.
    pub fn connected(&self) -> bool {
        self.current().is_some()
    }

    fn current(&self) -> Option<Arc<dyn BlockClient>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn client(&self) -> Result<Arc<dyn BlockClient>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let failures = self.failures.load(Ordering::Relaxed);
        let _one = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        if self.failures.load(Ordering::Relaxed) != failures {
            return Err(ClientError::Disconnected(format!(
                "{} is unreachable",
                self.url
            )));
        }
        let fresh = match self.reconnect().await {
            Ok(c) => c,
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        log::info!("reconnected to {}", self.url);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh.clone());
        Ok(fresh)
    }

    async fn reconnect(&self) -> Result<Arc<dyn BlockClient>> {
        let fresh = tokio::time::timeout(self.opts.timeout, connect_url(&self.url, &self.opts))
            .await
            .map_err(|_| ClientError::Timeout(format!("reconnecting to {}", self.url)))??;
        if fresh.size_bytes() != self.size || fresh.block_size() != self.block_size {
            // Another volume behind the same name: never write to it.
            return Err(ClientError::Protocol(format!(
                "{} came back with {} bytes in {}-byte blocks, was {} in {}",
                self.url,
                fresh.size_bytes(),
                fresh.block_size(),
                self.size,
                self.block_size
            )));
        }
        Ok(fresh)
    }

    /// A request that outlives the timeout counts as a broken connection.
    async fn bounded<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.opts.timeout, f)
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Timeout(format!(
                    "no answer from {} in {:?}",
                    self.url, self.opts.timeout
                )))
            })
    }

    /// Drop `failed` if it is still the current client and the error means the
    /// connection (not the request) is broken.
    fn note<T>(&self, failed: &Arc<dyn BlockClient>, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            let broken = matches!(
                e,
                ClientError::Io(_)
                    | ClientError::Timeout(_)
                    | ClientError::Disconnected(_)
                    | ClientError::Protocol(_)
            );
            if broken {
                let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
                if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
                    log::warn!("{}: {e}; will reconnect", self.url);
                    if let Some(old) = cur.take() {
                        // Closing may itself hang on a dead target: do not wait.
                        tokio::spawn(async move {
                            let _ = old.close().await;
                        });
                    }
                }
            }
        }
        r
    }
}

#[async_trait]
impl BlockClient for Reconnecting {
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let c = self.client().await?;
        let r = self.bounded(c.read(offset, buf)).await;
        self.note(&c, r)
    }
    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let c = self.client().await?;
        let r = self.bounded(c.write(offset, data)).await;
        self.note(&c, r)
    }
    async fn write_owned(&self, offset: u64, data: bytes::Bytes) -> Result<()> {
        let c = self.client().await?;
        let r = self.bounded(c.write_owned(offset, data)).await;
        self.note(&c, r)
    }
    async fn flush(&self) -> Result<()> {
        let c = self.client().await?;
        let r = self.bounded(c.flush()).await;
        self.note(&c, r)
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let c = self.client().await?;
        let r = self.bounded(c.discard(offset, len)).await;
        self.note(&c, r)
    }
    async fn close(&self) -> Result<()> {
        let c = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match c {
            Some(c) => c.close().await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests queued behind a reconnect that fails fail with it: one
    /// attempt for the lot, not one timeout each in turn.
    #[tokio::test]
    async fn waiters_behind_a_failed_reconnect_fail_without_trying_again() {
        // Nothing listens on the port of a socket we bound and dropped.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let r = Arc::new(Reconnecting {
            url: format!("iscsi://127.0.0.1:{port}/iqn.2026-11.org.blockwire:none/0"),
            opts: ConnectOptions {
                timeout: std::time::Duration::from_secs(5),
                ..Default::default()
            },
            size: 1 << 20,
            block_size: 512,
            describe: "test".into(),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            failures: AtomicU64::new(0),
        });
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let r = r.clone();
                tokio::spawn(async move { r.read(0, &mut [0u8; 512]).await })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap().is_err());
        }
        assert_eq!(
            r.failures.load(Ordering::Relaxed),
            1,
            "each waiter tried to reconnect on its own"
        );
        assert!(!r.connected());
    }
}
