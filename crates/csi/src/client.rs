//! A gRPC channel to a CSI plugin's Unix socket (tests, and tools that
//! speak to a running plugin as the CO's sidecars do).

use std::path::PathBuf;
use tonic::transport::{Channel, Endpoint, Uri};

pub async fn connect_unix(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    // The URI is not used: every connection is to the socket.
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}
