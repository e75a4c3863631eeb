//! The ttrpc Plugin service: each runtime request handed to the plugin.

use super::record::pod_record;
use super::*;

fn unimplemented<T>(method: &str) -> ttrpc::Result<T> {
    // UNIMPLEMENTED (not codegen's NOT_FOUND) makes NRI v0.12 runtimes fall
    // back to StateChange, the path every runtime version has.
    Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
        ttrpc::Code::UNIMPLEMENTED,
        format!("nri-qos handles {method} through StateChange"),
    )))
}

/// The timeout a request carries (`None`: the runtime sent none).
pub fn request_timeout(ctx: &TtrpcContext) -> Option<Duration> {
    u64::try_from(ctx.timeout_nano)
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_nanos)
}

fn ms(v: i64) -> Option<Duration> {
    u64::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .map(Duration::from_millis)
}

#[async_trait]
impl Plugin for QosPlugin {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let info = RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            request_timeout: ms(req.request_timeout),
            registration_timeout: ms(req.registration_timeout),
            // Timeouts and the oom_score_adj adjustment both arrived in NRI v0.7.0.
            applies_oom_score_adj: req.request_timeout > 0 || req.registration_timeout > 0,
        };
        info!(
            runtime = %info.name,
            version = %info.version,
            request_timeout_ms = crate::node::time::millis(info.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT)),
            oom_score_adj_supported = info.applies_oom_score_adj,
            config_bytes = req.config.len(),
            "configured by the runtime"
        );
        *lock(&self.runtime) = Some(info);
        self.apply_runtime_config(&req.config);
        self.configured.send_replace(true);
        Ok(api::ConfigureResponse {
            events: EVENTS,
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        // The reassembler takes the message encoded, as it comes.
        let message = protobuf::Message::write_to_bytes(&req);
        let message = message.map_err(crate::nri::lean_sync::invalid_request)?;
        let Some(whole) = self.push_sync(&message, ctx)? else {
            return Ok(super::sync::more_to_come());
        };
        let update = self.finish_sync(whole);
        self.synchronized.send_replace(true);
        Ok(api::SynchronizeResponse {
            update,
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        info!("runtime asked us to shut down");
        Ok(api::Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let started = Instant::now();
        let decision = self.decide_and_record(&req.pod, &req.container, None);
        let mut resp = api::CreateContainerResponse::new();
        let dry_run = self.dry_run();
        let mut counters = lock(&self.counters);
        counters.created += 1;
        if dry_run {
            info!(container = %req.container.name, adjustment = ?decision.adjustment, "dry run: adjustment not returned");
            self.record(decision.class, "dry_run", started);
            return Ok(resp);
        }
        if decision.adjustment.is_empty() {
            self.record(decision.class, "unchanged", started);
        } else {
            counters.adjusted += 1;
            self.record(decision.class, "applied", started);
        }
        resp.adjust = protobuf::MessageField::some(convert::adjustment_to_wire(
            decision.adjustment,
            self.applies_oom_score_adj(),
        ));
        Ok(resp)
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let decision =
            self.decide_and_record(&req.pod, &req.container, req.linux_resources.as_ref());
        let mut resp = api::UpdateContainerResponse::new();
        if self.dry_run() {
            return Ok(resp);
        }
        // Our update replaces the CRI request, so start from what was asked
        // and overlay the policy's values.
        let mut adj = decision.adjustment;
        if let Some(r) = req.linux_resources.as_ref() {
            let asked = convert::resources_from_wire(r);
            adj.cpu_shares = adj.cpu_shares.or(asked.cpu_shares);
            adj.cpu_quota = adj.cpu_quota.or(asked.cpu_quota);
            adj.cpu_period = adj.cpu_period.or(asked.cpu_period);
            adj.memory_limit = adj.memory_limit.or(asked.memory_limit);
            for (k, v) in asked.unified {
                adj.unified.entry(k).or_insert(v);
            }
        }
        if let Some(u) = convert::update_to_wire(&req.container.id, adj, false) {
            lock(&self.counters).updated += 1;
            resp.update.push(u);
        }
        Ok(resp)
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        // A stopped container holds no memory: its protection leaves the
        // pod and QoS cgroups (the keeper lowers them on the change). The
        // runtime reports exits of killed containers here too.
        debug!(container = %req.container.id, "container stopped; forgetting its protection");
        self.forget_container(&req.container.id);
        Ok(api::StopContainerResponse::new())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        match req.event.enum_value() {
            Ok(api::Event::POST_START_CONTAINER) => {
                self.oom_fallback(&req.container);
                self.learn_owner_after_start(&req.container);
            }
            Ok(api::Event::REMOVE_CONTAINER) => self.forget_container(&req.container.id),
            Ok(api::Event::REMOVE_POD_SANDBOX) => self.forget_pod(&req.pod.id),
            Ok(api::Event::RUN_POD_SANDBOX) => {
                let facts = convert::pod_from_wire(&req.pod);
                self.kubelet_owns_pod(&req.pod.id, &facts, &self.live().policy);
                lock(&self.registry)
                    .pods
                    .insert(req.pod.id.clone(), pod_record(&req.pod.id, &facts));
                self.notify_changed();
            }
            other => debug!(event = ?other, "state change ignored"),
        }
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        unimplemented("RunPodSandbox")
    }
    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        unimplemented("PostUpdatePodSandbox")
    }
    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        unimplemented("StopPodSandbox")
    }
    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        unimplemented("RemovePodSandbox")
    }
    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        unimplemented("PostCreateContainer")
    }
    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        unimplemented("StartContainer")
    }
    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        unimplemented("PostStartContainer")
    }
    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        unimplemented("PostUpdateContainer")
    }
    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        unimplemented("RemoveContainer")
    }
}
