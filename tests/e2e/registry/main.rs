//! A read-only container registry for the e2e VM: serves one OCI image
//! layout directory over plain HTTP on the guest's loopback, so CRI-O
//! (which pulls through containers/image and has no image import) gets the
//! same busybox image containerd imports with `ctr`.
//!
//!   oci-registry <oci-layout-dir> [127.0.0.1:5000]
//!
//! Every repository and tag name resolves to the layout's first manifest
//! (`registries.conf` maps e2e.local and registry.k8s.io here); manifests and
//! blobs are also served by digest. Only GET and HEAD, one thread per
//! connection, `Connection: close`: just enough of the distribution API for
//! a pull, never meant for anything but a test guest.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

struct Layout {
    dir: PathBuf,
    /// digest ("sha256:...") and media type of the image every tag names
    manifest: (String, String),
}

impl Layout {
    fn open(dir: &Path) -> Result<Layout> {
        let index: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("index.json"))
                .with_context(|| format!("reading {}/index.json", dir.display()))?,
        )?;
        let first = index
            .get("manifests")
            .and_then(|m| m.get(0))
            .context("index.json lists no manifest")?;
        let digest = first
            .get("digest")
            .and_then(Value::as_str)
            .context("manifest without digest")?;
        let media = first
            .get("mediaType")
            .and_then(Value::as_str)
            .unwrap_or(MANIFEST_TYPE);
        Ok(Layout {
            dir: dir.to_path_buf(),
            manifest: (digest.to_string(), media.to_string()),
        })
    }

    /// The blob file of a `sha256:<hex>` digest (hex only: no path tricks).
    fn blob(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(self.dir.join("blobs/sha256").join(hex))
    }

    /// (status, content type, digest header, body) for a request path.
    fn answer(&self, path: &str) -> (u16, String, Option<String>, Vec<u8>) {
        let not_found = (404, "text/plain".into(), None, b"not found\n".to_vec());
        if path == "/v2/" || path == "/v2" {
            return (200, "application/json".into(), None, b"{}".to_vec());
        }
        let Some(rest) = path.strip_prefix("/v2/") else {
            return not_found;
        };
        let (kind, reference) = match (rest.rfind("/manifests/"), rest.rfind("/blobs/")) {
            (Some(i), _) => ("manifest", &rest[i + "/manifests/".len()..]),
            (None, Some(i)) => ("blob", &rest[i + "/blobs/".len()..]),
            _ => return not_found,
        };
        let digest = if kind == "manifest" && !reference.starts_with("sha256:") {
            self.manifest.0.as_str()
        } else {
            reference
        };
        let Some(body) = self.blob(digest).and_then(|p| std::fs::read(p).ok()) else {
            return not_found;
        };
        let ctype = if kind == "manifest" {
            self.manifest.1.clone()
        } else {
            "application/octet-stream".into()
        };
        (200, ctype, Some(digest.to_string()), body)
    }
}

fn serve(layout: &Layout, stream: TcpStream) -> Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, target) = match (words.next(), words.next()) {
        (Some(m @ ("GET" | "HEAD")), Some(t)) => (m, t),
        // e.g. a TLS ClientHello: the client then falls back to plain HTTP
        _ => bail!("not an HTTP GET/HEAD: {:?}", line.trim()),
    };
    // the headers: read and ignored
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
    }
    let path = target.split('?').next().unwrap_or(target);
    let (status, ctype, digest, body) = layout.answer(path);
    let reason = if status == 200 { "OK" } else { "Not Found" };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Docker-Distribution-API-Version: registry/2.0\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(d) = digest {
        head.push_str(&format!("Docker-Content-Digest: {d}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = stream;
    out.write_all(head.as_bytes())?;
    if method == "GET" {
        out.write_all(&body)?;
    }
    out.flush()?;
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: oci-registry <oci-layout-dir> [addr]")?,
    );
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:5000".into());
    let layout = std::sync::Arc::new(Layout::open(&dir)?);
    let listener = TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
    eprintln!(
        "oci-registry: {} on http://{addr}, every tag is {}",
        dir.display(),
        layout.manifest.0
    );
    for stream in listener.incoming().flatten() {
        let layout = layout.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve(&layout, stream) {
                eprintln!("oci-registry: {e:#}");
            }
        });
    }
    Ok(())
}
