//! `nfs://`: a file on an NFSv3 export as a block volume, through
//! `bw_nfs` (the wire and the RPC transport live there).

use crate::{check_range, BlockClient, ClientError, ConnectOptions, Result, TargetUrl};
use async_trait::async_trait;
use bw_nfs::{Error, FileSpec, NfsFile};
use std::sync::Arc;

pub struct NfsClient {
    url: String,
    file: NfsFile,
    /// The file's size rounded down to whole blocks.
    size: u64,
}

fn client_error(e: Error) -> ClientError {
    match e {
        Error::Io(e) => ClientError::Io(e),
        Error::Timeout(w) => ClientError::Timeout(w),
        Error::Disconnected(w) => ClientError::Disconnected(w),
        Error::Xdr(w) | Error::Rpc(w) => ClientError::Protocol(w),
        e @ (Error::Nfs { .. } | Error::Mount { .. } | Error::Invalid(_)) => ClientError::Target(e.to_string()),
    }
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    let TargetUrl::Nfs { host, port, export, file, sync } = url else {
        unreachable!("nfs::connect called with {url}");
    };
    let spec = FileSpec { host: host.clone(), port: *port, export: export.clone(), path: file.clone(), sync: *sync };
    let file = NfsFile::open(spec, opts.timeout).await.map_err(|e| match e {
        Error::Io(_) => client_error(e),
        e => ClientError::Target(format!("{url}: {e}")),
    })?;
    let size = file.size() / 512 * 512;
    Ok(Arc::new(NfsClient { url: url.to_string(), file, size }))
}

#[async_trait]
impl BlockClient for NfsClient {
    fn identity(&self) -> Option<String> {
        let s = self.file.spec();
        Some(format!("NFS server {}:{}, export {}", s.host, s.port, s.export))
    }

    fn describe(&self) -> String {
        let f = &self.file;
        format!("{} (NFSv3, reads up to {} B, writes up to {} B, {})", self.url, f.max_read, f.max_write, if f.spec().sync { "FILE_SYNC" } else { "UNSTABLE + COMMIT" })
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(self, offset, buf.len())?;
        self.file.read(offset, buf).await.map_err(client_error)
    }

    async fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_range(self, offset, data.len())?;
        self.file.write(offset, data).await.map_err(client_error)
    }

    async fn flush(&self) -> Result<()> {
        self.file.flush().await.map_err(client_error)
    }

    async fn close(&self) -> Result<()> {
        self.file.close();
        Ok(())
    }
}
