//! A Synchronize decoded into only the fields nri-qos reads.
//!
//! A runtime describes every container of the node in one Synchronize,
//! with its args, environment, mounts, hooks, rlimits and devices, none of
//! which the policy, the registry or `audit` ever reads. The generated
//! parser builds all of it (some 384 bytes of structs per container before
//! any of those lists); this decoder keeps the same `api` types but fills
//! only what is read and skips the rest on the wire. A plugin may take the
//! message still encoded ([`SynchronizeEncoded`]): the plugin's own
//! decodes a Synchronize sent as one message pod by pod from its bytes
//! ([`index_synchronize`]); otherwise the request's bytes are freed before
//! the handler runs. What it keeps is exactly what the generated parser
//! gives for those fields (tested against it).
//!
//! Kept: a pod's id, name, uid, namespace, labels, annotations and its
//! `linux.cgroup_parent` and `linux.pod_resources`; a container's id,
//! pod_sandbox_id, name, state, labels, annotations, pid and its
//! `linux.resources`, `linux.oom_score_adj` and `linux.cgroups_path`; of
//! resources, memory, cpu and unified.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use protobuf::{CodedInputStream, Message};
use ttrpc::r#async::{MethodHandler, TtrpcContext};

use super::mux::Services;
use super::proto::api;
use super::proto::api_ttrpc::{self, Plugin};

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
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut req = api::SynchronizeRequest::new();
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match tag {
            10 => {
                req.pods.push(message(&mut is, pod_fields)?);
            }
            18 => {
                req.containers.push(message(&mut is, container_fields)?);
            }
            24 => req.more = is.read_bool()?,
            _ => skip(&mut is, tag)?,
        }
    }
    Ok(req)
}

/// A Synchronize message whose pods and containers are only located, to be
/// decoded by [`decode_pod`] and [`decode_container`] when their pod's turn
/// comes: the whole message decoded at once took ~1.5 KB of heap per
/// container for ~170 B on the wire.
#[derive(Debug)]
pub struct Indexed {
    /// Each pod's bytes in the message, in the order sent, and its id.
    pub pods: Vec<(Range<usize>, String)>,
    /// Each container's bytes in the message, in the order sent, and the
    /// index in `pods` of the pod it names (of two pods with one id, the
    /// later, as a map keeps it), if any.
    pub containers: Vec<(Range<usize>, Option<usize>)>,
    pub more: bool,
}

/// [`decode_synchronize`], but the containers only located (see
/// [`Indexed`]). Each is decoded once here, so bytes that
/// [`decode_synchronize`] refuses are refused here too.
pub fn index_synchronize(bytes: &[u8]) -> protobuf::Result<Indexed> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut pods = Vec::new();
    let mut located = Vec::new();
    let mut more = false;
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match tag {
            10 => {
                let start = position(&is);
                let p: api::PodSandbox = message(&mut is, pod_fields)?;
                pods.push((start..position(&is), p.id));
            }
            18 => {
                let start = position(&is);
                let c: api::Container = message(&mut is, container_fields)?;
                located.push((start..position(&is), c.pod_sandbox_id));
            }
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
        .map(|(range, pod)| (range, by_id.get(pod.as_str()).copied()))
        .collect();
    drop(by_id);
    Ok(Indexed {
        pods,
        containers,
        more,
    })
}

/// Whether a Synchronize chunk says more follow: its top-level fields
/// only, the pods and containers skipped.
pub fn says_more(bytes: &[u8]) -> protobuf::Result<bool> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut more = false;
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        match tag {
            24 => more = is.read_bool()?,
            _ => skip(&mut is, tag)?,
        }
    }
    Ok(more)
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
        42 => map_entry(is, &mut pod.labels)?,
        50 => map_entry(is, &mut pod.annotations)?,
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
        42 => map_entry(is, &mut c.labels)?,
        50 => map_entry(is, &mut c.annotations)?,
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
        50 => map_entry(is, &mut r.unified)?,
        _ => skip(is, tag)?,
    }
    Ok(())
}

/// One `map<string, string>` entry; a missing key or value is empty, and
/// a later entry for a key replaces an earlier one (as generated).
fn map_entry(is: &mut Is<'_>, map: &mut HashMap<String, String>) -> protobuf::Result<()> {
    let entry: (String, String) = message(is, |is, (k, v), tag| {
        match tag {
            10 => *k = is.read_string()?,
            18 => *v = is.read_string()?,
            _ => skip(is, tag)?,
        }
        Ok(())
    })?;
    map.insert(entry.0, entry.1);
    Ok(())
}

#[cfg(test)]
mod tests;
