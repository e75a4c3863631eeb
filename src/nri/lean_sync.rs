//! A Synchronize decoded into only the fields nri-qos reads.
//!
//! A runtime describes every container of the node in one Synchronize,
//! with its args, environment, mounts, hooks, rlimits and devices, none of
//! which the policy, the registry or `audit` ever reads. The generated
//! parser builds all of it (some 384 bytes of structs per container before
//! any of those lists); this decoder keeps the same `api` types but fills
//! only what is read and skips the rest on the wire. A plugin may take the
//! message still encoded ([`SynchronizeEncoded`]): the plugin and `audit`
//! hand it to the reassembler, which decodes it one object at a time
//! ([`for_each_object`]) and keeps the objects re-encoded; the plugin
//! decodes those pod by pod ([`index_synchronize`]). Otherwise the
//! request's bytes are freed before the handler runs. What it keeps is
//! exactly what the generated parser gives for those fields (tested
//! against it).
//!
//! Kept: a pod's id, name, uid, namespace, the annotations the policy
//! reads ([`policy::reads_pod_annotation`]) and its `linux.cgroup_parent`
//! and `linux.pod_resources`; a container's id, pod_sandbox_id, name,
//! state, the annotations the policy reads
//! ([`view::reads_container_annotation`]), pid and its
//! `linux.resources`, `linux.oom_score_adj` and `linux.cgroups_path`; of
//! resources, memory, cpu and unified. Labels are never read: a peer's
//! maps of any size cost nothing beyond decoding. Of a map, at most
//! [`MAP_ENTRIES`] entries of at most [`ENTRY_BYTES`] each are kept.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use protobuf::{CodedInputStream, CodedOutputStream, Message};
use ttrpc::r#async::{MethodHandler, TtrpcContext};

use super::mux::Services;
use super::proto::api;
use super::proto::api_ttrpc::{self, Plugin};
use super::view;
use crate::qos::policy;

const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// A plugin that may take a Synchronize message still encoded and answer
/// it encoded. By default it is decoded by [`decode_synchronize`] (its
/// bytes freed first) and the answer encoded by the generated encoder.
#[async_trait]
pub trait SynchronizeEncoded: Plugin {
    async fn synchronize_encoded(
        &self,
        ctx: &TtrpcContext,
        payload: Vec<u8>,
    ) -> ttrpc::Result<Vec<u8>> {
        synchronize_decoded(self, ctx, payload).await
    }
}

/// A Synchronize decoded by [`decode_synchronize`] (its bytes freed
/// first), handled by the plugin's `synchronize` and its answer encoded:
/// what a [`SynchronizeEncoded`] does with a message it does not take
/// encoded.
pub async fn synchronize_decoded<P: Plugin + ?Sized>(
    plugin: &P,
    ctx: &TtrpcContext,
    payload: Vec<u8>,
) -> ttrpc::Result<Vec<u8>> {
    let req = decode_synchronize(&payload).map_err(invalid_request)?;
    drop(payload);
    let answer = plugin.synchronize(ctx, req).await?;
    answer.write_to_bytes().map_err(not_encodable)
}

/// The status an answer that cannot be encoded is replaced with.
pub fn not_encodable(e: protobuf::Error) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(
        ttrpc::Code::INTERNAL,
        format!("cannot encode the SynchronizeResponse: {e}"),
    ))
}

/// The status a Synchronize that does not decode is answered with.
pub fn invalid_request(e: protobuf::Error) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(
        ttrpc::Code::INVALID_ARGUMENT,
        format!("cannot decode the SynchronizeRequest: {e}"),
    ))
}

/// The Plugin service as ttrpc-codegen builds it, but for Synchronize,
/// which goes to [`SynchronizeEncoded`].
pub fn create_plugin(service: Arc<dyn SynchronizeEncoded + Send + Sync>) -> Services {
    let plugin: Arc<dyn Plugin + Send + Sync> = service.clone();
    let mut services = api_ttrpc::create_plugin(plugin);
    if let Some(plugin) = services.get_mut(PLUGIN_SERVICE) {
        plugin
            .methods
            .insert("Synchronize".into(), Box::new(LeanSynchronize { service }));
    }
    services
}

struct LeanSynchronize {
    service: Arc<dyn SynchronizeEncoded + Send + Sync>,
}

#[async_trait]
impl MethodHandler for LeanSynchronize {
    async fn handler(
        &self,
        ctx: TtrpcContext,
        req: ttrpc::Request,
    ) -> ttrpc::Result<ttrpc::Response> {
        let payload = self.service.synchronize_encoded(&ctx, req.payload).await?;
        Ok(ttrpc::Response {
            status: protobuf::MessageField::some(ttrpc::get_status(ttrpc::Code::OK, "")),
            payload,
            ..Default::default()
        })
    }
}

type Is<'a> = CodedInputStream<'a>;

/// A Synchronize chunk with only the fields nri-qos reads (see the module
/// comment); an error for bytes that are not a valid message.
pub fn decode_synchronize(bytes: &[u8]) -> protobuf::Result<api::SynchronizeRequest> {
    let mut req = api::SynchronizeRequest::new();
    let walked = for_each_object(bytes, |o| {
        match o {
            Object::Pod(p) => req.pods.push(p),
            Object::Container(c) => req.containers.push(c),
        }
        Next::Decode
    })?;
    req.more = walked.more;
    Ok(req)
}

/// A pod or a container of a Synchronize, with only the fields nri-qos
/// reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Pod(api::PodSandbox),
    Container(api::Container),
}

impl Object {
    /// Its bytes as a field of a SynchronizeRequest (tag, length, body).
    pub fn framed_len(&self) -> usize {
        let body = match self {
            Object::Pod(p) => p.compute_size(),
            Object::Container(c) => c.compute_size(),
        };
        let framed = 1 + protobuf::rt::compute_raw_varint64_size(body) + body;
        usize::try_from(framed).unwrap_or(usize::MAX)
    }

    /// Appends it to `out` as a field of a SynchronizeRequest
    /// ([`Self::framed_len`] bytes, which must be called first: its sizes
    /// are the ones written).
    pub fn write_framed(&self, out: &mut Vec<u8>) -> protobuf::Result<()> {
        let mut os = CodedOutputStream::vec(out);
        match self {
            Object::Pod(p) => write_field(&mut os, 1, p)?,
            Object::Container(c) => write_field(&mut os, 2, c)?,
        }
        os.flush()
    }
}

/// `m` as length-delimited field `field`, with the sizes last computed.
fn write_field(
    os: &mut CodedOutputStream<'_>,
    field: u32,
    m: &impl Message,
) -> protobuf::Result<()> {
    os.write_raw_varint32(field << 3 | 2)?;
    os.write_raw_varint32(m.cached_size())?;
    m.write_to_with_cached_sizes(os)
}

/// What [`for_each_object`] is to do with the objects after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Decode,
    /// Count them, nothing of them decoded.
    Count,
}

/// A Synchronize chunk walked by [`for_each_object`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    pub more: bool,
    /// Objects counted, not decoded.
    pub counted: usize,
}

/// Decodes a Synchronize chunk (see the module comment) one object at a
/// time, each handed to `each` as soon as it is decoded, so that a chunk's
/// objects are never all alive at once, until `each` says to only count
/// the rest. An error for bytes that are not a valid message, after the
/// objects before the fault were handed over.
pub fn for_each_object(
    bytes: &[u8],
    mut each: impl FnMut(Object) -> Next,
) -> protobuf::Result<Walked> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let (mut next, mut walked) = (
        Next::Decode,
        Walked {
            more: false,
            counted: 0,
        },
    );
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match (tag, next) {
            (10 | 18, Next::Count) => {
                walked.counted += 1;
                skip(&mut is, tag)?;
            }
            (10, Next::Decode) => next = each(Object::Pod(message(&mut is, pod_fields)?)),
            (18, Next::Decode) => {
                next = each(Object::Container(message(&mut is, container_fields)?))
            }
            (24, _) => walked.more = is.read_bool()?,
            _ => skip(&mut is, tag)?,
        }
    }
    Ok(walked)
}

/// A Synchronize chunk's pods and containers counted, and its `more`,
/// nothing of them decoded: for a chunk too late to keep.
pub fn count_objects(bytes: &[u8]) -> protobuf::Result<Walked> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut walked = Walked {
        more: false,
        counted: 0,
    };
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match tag {
            24 => walked.more = is.read_bool()?,
            10 | 18 => {
                walked.counted += 1;
                skip(&mut is, tag)?;
            }
            _ => skip(&mut is, tag)?,
        }
    }
    Ok(walked)
}

/// A Synchronize message whose pods and containers are only located, to be
/// decoded by [`decode_pod`] and [`decode_container`] when their pod's turn
/// comes: the whole message decoded at once took ~1.5 KB of heap per
/// container for ~170 B on the wire.
#[derive(Debug, Default)]
pub struct Indexed {
    /// Each pod's bytes in the message, in the order sent, and its id.
    pub pods: Vec<(Range<usize>, String)>,
    /// Each container's bytes in the message, in the order sent, and the
    /// index in `pods` of the pod it names (of two pods with one id, the
    /// later, as a map keeps it), if any.
    pub containers: Vec<(Range<usize>, Option<usize>)>,
    pub more: bool,
}

/// A Synchronize's pods and containers located (see [`Indexed`]), only
/// their ids read: for the reassembler's own encoding
/// ([`crate::nri::reassembly::Held`]), which needs no checking. A field
/// sent twice counts as sent last, as [`decode_synchronize`] takes it.
pub fn index_synchronize(bytes: &[u8]) -> protobuf::Result<Indexed> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut pods = Vec::new();
    let mut located = Vec::new();
    let mut more = false;
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match tag {
            10 => {
                let (at, id) = located_with(&mut is, bytes, 10)?;
                pods.push((at, id.to_string()));
            }
            18 => located.push(located_with(&mut is, bytes, 18)?),
            24 => more = is.read_bool()?,
            _ => skip(&mut is, tag)?,
        }
    }
    let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(pods.len());
    for (i, (_, id)) in pods.iter().enumerate() {
        by_id.insert(id.as_str(), i);
    }
    let containers = located
        .into_iter()
        .map(|(range, pod)| (range, by_id.get(pod).copied()))
        .collect();
    drop(by_id);
    Ok(Indexed {
        pods,
        containers,
        more,
    })
}

/// One pod located by [`index_synchronize`] (its length and body).
pub fn decode_pod(located: &[u8]) -> protobuf::Result<api::PodSandbox> {
    message(&mut CodedInputStream::from_bytes(located), pod_fields)
}

/// One container located by [`index_synchronize`] (its length and body).
pub fn decode_container(located: &[u8]) -> protobuf::Result<api::Container> {
    message(&mut CodedInputStream::from_bytes(located), container_fields)
}

fn position(is: &Is<'_>) -> usize {
    usize::try_from(is.pos()).unwrap_or(usize::MAX)
}

/// A submessage of `bytes` located (its length and body) and its string
/// field `tag` (the last one sent; empty when absent or not UTF-8),
/// borrowed from `bytes`.
fn located_with<'a>(
    is: &mut Is<'_>,
    bytes: &'a [u8],
    want: u32,
) -> protobuf::Result<(Range<usize>, &'a str)> {
    let start = position(is);
    let len = is.read_raw_varint64()?;
    let outer = is.push_limit(len)?;
    let mut found = "";
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        if tag != want {
            skip(is, tag)?;
            continue;
        }
        let n = is.read_raw_varint32()?;
        let at = position(is);
        is.skip_raw_bytes(n)?;
        let field = bytes.get(at..position(is)).unwrap_or_default();
        found = std::str::from_utf8(field).unwrap_or_default();
    }
    is.pop_limit(outer);
    Ok((start..position(is), found))
}

/// Reads a length-delimited submessage with `fields`. A singular field
/// sent twice keeps the later one whole, as the generated parser does.
fn message<T: Default>(
    is: &mut Is<'_>,
    fields: fn(&mut Is<'_>, &mut T, u32) -> protobuf::Result<()>,
) -> protobuf::Result<T> {
    let mut m = T::default();
    nested(is, &mut m, fields)?;
    Ok(m)
}

fn nested<T>(
    is: &mut Is<'_>,
    into: &mut T,
    fields: fn(&mut Is<'_>, &mut T, u32) -> protobuf::Result<()>,
) -> protobuf::Result<()> {
    let len = is.read_raw_varint64()?;
    let outer = is.push_limit(len)?;
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        fields(is, into, tag)?;
    }
    is.pop_limit(outer);
    Ok(())
}

fn skip(is: &mut Is<'_>, tag: u32) -> protobuf::Result<()> {
    protobuf::rt::skip_field_for_tag(tag, is)
}

fn pod_fields(is: &mut Is<'_>, pod: &mut api::PodSandbox, tag: u32) -> protobuf::Result<()> {
    match tag {
        10 => pod.id = is.read_string()?,
        18 => pod.name = is.read_string()?,
        26 => pod.uid = is.read_string()?,
        34 => pod.namespace = is.read_string()?,
        50 => map_entry(is, &mut pod.annotations, policy::reads_pod_annotation)?,
        66 => pod.linux = Some(message(is, pod_linux_fields)?).into(),
        _ => skip(is, tag)?,
    }
    Ok(())
}

fn pod_linux_fields(
    is: &mut Is<'_>,
    linux: &mut api::LinuxPodSandbox,
    tag: u32,
) -> protobuf::Result<()> {
    match tag {
        18 => linux.pod_resources = Some(message(is, resources_fields)?).into(),
        26 => linux.cgroup_parent = is.read_string()?,
        _ => skip(is, tag)?,
    }
    Ok(())
}

fn container_fields(is: &mut Is<'_>, c: &mut api::Container, tag: u32) -> protobuf::Result<()> {
    match tag {
        10 => c.id = is.read_string()?,
        18 => c.pod_sandbox_id = is.read_string()?,
        26 => c.name = is.read_string()?,
        32 => c.state = is.read_enum_or_unknown()?,
        50 => map_entry(is, &mut c.annotations, view::reads_container_annotation)?,
        90 => c.linux = Some(message(is, container_linux_fields)?).into(),
        96 => c.pid = is.read_uint32()?,
        _ => skip(is, tag)?,
    }
    Ok(())
}

fn container_linux_fields(
    is: &mut Is<'_>,
    linux: &mut api::LinuxContainer,
    tag: u32,
) -> protobuf::Result<()> {
    match tag {
        26 => linux.resources = Some(message(is, resources_fields)?).into(),
        34 => linux.oom_score_adj = Some(is.read_message()?).into(),
        42 => linux.cgroups_path = is.read_string()?,
        _ => skip(is, tag)?,
    }
    Ok(())
}

/// Memory and cpu are small and read whole; devices, hugepages, blockio,
/// rdt and pids are skipped.
fn resources_fields(
    is: &mut Is<'_>,
    r: &mut api::LinuxResources,
    tag: u32,
) -> protobuf::Result<()> {
    match tag {
        10 => r.memory = Some(is.read_message()?).into(),
        18 => r.cpu = Some(is.read_message()?).into(),
        50 => map_entry(is, &mut r.unified, |_| true)?,
        _ => skip(is, tag)?,
    }
    Ok(())
}

/// Entries kept of one map, and the most bytes (key and value) of one:
/// every key nri-qos reads holds a name, a quantity or a cgroup value, so
/// more is a peer's fault, and would only be decoded to be held.
pub const MAP_ENTRIES: usize = 256;
pub const ENTRY_BYTES: usize = 1024;

/// One `map<string, string>` entry, kept if `read` takes its key and it
/// fits [`MAP_ENTRIES`] and [`ENTRY_BYTES`]; a missing key or value is
/// empty, and a later entry for a key replaces an earlier one (as
/// generated).
fn map_entry(
    is: &mut Is<'_>,
    map: &mut HashMap<String, String>,
    read: fn(&str) -> bool,
) -> protobuf::Result<()> {
    let (k, v): (String, String) = message(is, |is, (k, v), tag| {
        match tag {
            10 => *k = is.read_string()?,
            18 => *v = is.read_string()?,
            _ => skip(is, tag)?,
        }
        Ok(())
    })?;
    let fits =
        k.len() + v.len() <= ENTRY_BYTES && (map.len() < MAP_ENTRIES || map.contains_key(&k));
    if fits && read(&k) {
        map.insert(k, v);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
