//! Two servers for the same exposition: a hand-written accept loop (one GET
//! per connection, like src/metrics.rs) and hyper 1's HTTP/1 server. Each
//! runs on a current-thread tokio runtime until the self-test client is done.
use crate::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn run<E: Exposition, F, Fut>(m: Arc<E>, mut answer: F)
where
    F: FnMut(tokio::net::TcpStream, Arc<E>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let n = scrapes();
    let client = std::thread::spawn(move || self_test(addr, n));
    while !client.is_finished() {
        let accept = tokio::time::timeout(Duration::from_millis(50), listener.accept());
        let Ok(Ok((s, _))) = accept.await else {
            continue;
        };
        answer(s, m.clone()).await;
    }
    client.join().expect("client");
}

pub fn hand<E: Exposition>(m: E) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut i = 0;
    rt.block_on(run(Arc::new(m), |mut s, m| {
        i += 1;
        let i = i;
        async move {
            let mut head = [0u8; 8192];
            let _ = s.read(&mut head).await;
            m.touch(i);
            let body = m.render();
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(reply.as_bytes()).await;
        }
    }));
}

pub fn hyper<E: Exposition>(m: E) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let mut i = 0;
    rt.block_on(run(Arc::new(m), |s, m| {
        i += 1;
        let i = i;
        async move {
            let service = hyper::service::service_fn(move |_req| {
                let m = m.clone();
                async move {
                    m.touch(i);
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        m.render(),
                    ))))
                }
            });
            let io = hyper_util::rt::TokioIo::new(s);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        }
    }));
}
