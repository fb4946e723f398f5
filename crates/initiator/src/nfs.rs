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

/// The file an `nfs://` URL names.
fn file_spec(url: &TargetUrl) -> Result<FileSpec> {
    let TargetUrl::Nfs { host, port, export, file, sync } = url else {
        return Err(ClientError::Protocol(format!("{url} is not an nfs:// URL")));
    };
    Ok(FileSpec { host: host.clone(), port: *port, export: export.clone(), path: file.clone(), sync: *sync })
}

/// Make the image file `url` names, `size` bytes of non-zero data (reads
/// of a sparse file would be answered from holes): created GUARDED, so an
/// existing file is an error and is left as it is.
pub async fn create_image(url: &TargetUrl, size: u64, timeout: std::time::Duration) -> Result<()> {
    let spec = file_spec(url)?;
    bw_nfs::create(&spec, timeout).await.map_err(|e| ClientError::Target(format!("{url}: {e}")))?;
    let file = NfsFile::open(spec, timeout).await.map_err(|e| ClientError::Target(format!("{url}: {e}")))?;
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut at = 0;
    while at < size {
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        let n = (size - at).min(block.len() as u64) as usize;
        file.write(at, &block[..n]).await.map_err(client_error)?;
        at += n as u64;
    }
    file.flush().await.map_err(client_error)?;
    file.close();
    Ok(())
}

/// Remove the image file `url` names.
pub async fn remove_image(url: &TargetUrl, timeout: std::time::Duration) -> Result<()> {
    bw_nfs::remove(&file_spec(url)?, timeout).await.map_err(|e| ClientError::Target(format!("{url}: {e}")))
}

pub async fn connect(url: &TargetUrl, opts: &ConnectOptions) -> Result<Arc<dyn BlockClient>> {
    let spec = file_spec(url)?;
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
