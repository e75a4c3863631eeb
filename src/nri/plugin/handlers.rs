//! The ttrpc Plugin service: each runtime request handed to the plugin.
//! Every RPC is answered, none with UNIMPLEMENTED: one such answer makes a
//! v0.12 runtime send every event through StateChange from then on.

use super::events::EventPath;
use super::*;
use crate::nri::view;

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
        let timeouts = req.request_timeout > 0 || req.registration_timeout > 0;
        let quirks = RuntimeQuirks::decide(
            &req.runtime_name,
            &req.runtime_version,
            &req.NRI_version,
            timeouts,
        );
        let events = event_mask(&quirks);
        let info = RuntimeInfo {
            request_timeout: ms(req.request_timeout),
            registration_timeout: ms(req.registration_timeout),
            quirks,
        };
        let q = &info.quirks;
        info!(
            runtime = %q.name,
            version = %q.version,
            nri_version = %q.nri_label(),
            nri_version_from = q.nri_source.label(),
            request_timeout_ms = crate::node::time::millis(info.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT)),
            oom_score_adj_supported = q.applies_oom_score_adj,
            shows_unified = q.shows_unified,
            per_event_rpcs = q.dedicated_event_rpcs,
            events = %format_args!("{events:#x}"),
            config_bytes = req.config.len(),
            "configured by the runtime"
        );
        super::super::relax::LINK.set_update_deadlock_fixed(q.update_deadlock_fixed);
        *lock(&self.runtime) = Some(info);
        self.apply_runtime_config(&req.config);
        self.configured.send_replace(true);
        Ok(api::ConfigureResponse {
            events,
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
        self.note_event(api::Event::CREATE_CONTAINER, EventPath::Dedicated);
        let decision = self.decide_and_record(&req.pod, &req.container, view::Source::Reported);
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
        resp.adjust = protobuf::MessageField::some(view::create_adjustment(
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
        self.note_event(api::Event::UPDATE_CONTAINER, EventPath::Dedicated);
        let source = match req.linux_resources.as_ref() {
            Some(r) => view::Source::CriRequest(r),
            None => view::Source::Reported,
        };
        let decision = self.decide_and_record(&req.pod, &req.container, source);
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
        self.note_event(api::Event::STOP_CONTAINER, EventPath::Dedicated);
        debug!(container = %req.container.id, "container stopped; forgetting its protection");
        self.forget_container(&req.container.id);
        Ok(api::StopContainerResponse::new())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let event = req.event.enum_value().unwrap_or(api::Event::UNKNOWN);
        self.on_event(event, &req.pod, &req.container, EventPath::StateChange);
        Ok(api::Empty::new())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        let started = Instant::now();
        self.note_event(api::Event::UPDATE_POD_SANDBOX, EventPath::Dedicated);
        self.pod_resized(&req.pod, req.linux_resources.as_ref());
        self.metrics.observe_hook(started.elapsed());
        Ok(api::UpdatePodSandboxResponse::new())
    }

    /// Never subscribed to; should a runtime ask, nothing is rejected.
    async fn validate_container_adjustment(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        Ok(api::ValidateContainerAdjustmentResponse::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        let none = api::Container::default();
        self.on_event(
            api::Event::RUN_POD_SANDBOX,
            &req.pod,
            &none,
            EventPath::Dedicated,
        );
        Ok(api::RunPodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        let none = api::Container::default();
        let event = api::Event::POST_UPDATE_POD_SANDBOX;
        self.on_event(event, &req.pod, &none, EventPath::Dedicated);
        Ok(api::PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        let none = api::Container::default();
        self.on_event(
            api::Event::STOP_POD_SANDBOX,
            &req.pod,
            &none,
            EventPath::Dedicated,
        );
        Ok(api::StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        let none = api::Container::default();
        let event = api::Event::REMOVE_POD_SANDBOX;
        self.on_event(event, &req.pod, &none, EventPath::Dedicated);
        Ok(api::RemovePodSandboxResponse::new())
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        let event = api::Event::POST_CREATE_CONTAINER;
        self.on_event(event, &req.pod, &req.container, EventPath::Dedicated);
        Ok(api::PostCreateContainerResponse::new())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        let event = api::Event::START_CONTAINER;
        self.on_event(event, &req.pod, &req.container, EventPath::Dedicated);
        Ok(api::StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        let event = api::Event::POST_START_CONTAINER;
        self.on_event(event, &req.pod, &req.container, EventPath::Dedicated);
        Ok(api::PostStartContainerResponse::new())
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        let event = api::Event::POST_UPDATE_CONTAINER;
        self.on_event(event, &req.pod, &req.container, EventPath::Dedicated);
        Ok(api::PostUpdateContainerResponse::new())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        let event = api::Event::REMOVE_CONTAINER;
        self.on_event(event, &req.pod, &req.container, EventPath::Dedicated);
        Ok(api::RemoveContainerResponse::new())
    }
}
