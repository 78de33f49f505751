//! The running half of pods: every tick, each pod's container is brought to
//! what its owner asked for, and what the engine reports is written back.
//!
//! - desired RUNNING: no container yet → pull, create and start it (a pull
//!   or start that fails puts the pod in ERROR with the reason, unbilled);
//!   a container of an older configuration → replaced; a stopped container
//!   after a `start` → started again (its files are still there); a
//!   container that stopped by itself → the pod is EXITED with the exit
//!   code; a `restart` asked after the run began → stopped and started.
//! - desired EXITED: a running container is stopped (and kept).
//! - desired TERMINATED: the container and the persistent volume are removed.
//!
//! Each stretch a container runs is a `pod_runs` row, opened when the
//! engine has started it and closed when it is seen stopped; from then until
//! the next start, or until the pod is terminated and its disk removed, a
//! `disk` row charges what the stopped pod keeps. Both are what
//! [`ContainerService::accrue_pods`] charges. Slow engine calls (a stop
//! waits for the grace period) run in tasks of their own, one per pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gantry_runtime::{Container as RuntimeContainer, ContainerSpec, ContainerState, Network, RegistryAuth, Runtime};

use crate::fleet::{Fleet, LABEL_ID, LABEL_INSTALLATION, LABEL_KIND, LABEL_OWNER, LABEL_VERSION, registry_host};
use crate::gpus::{Grant, LABEL_GPUS};
use crate::pods::{
    PodRecord, PodStatus, cluster_network_name, network_volume_name, pod_container_name, pod_env, pod_volume_name,
};
use crate::service::{ContainerError, now_ms};
use crate::spec::split_args;

/// How long before an engine outage a pod's container may have stopped and
/// still count as stopped by the engine going down (and how long a stop is
/// left undecided, in case an outage follows it).
pub(crate) const OUTAGE_MARGIN_MS: i64 = 10_000;

/// Label value of pod containers.
pub const KIND_POD: &str = "pod";

impl Fleet {
    /// One look at every pod and every pod container.
    pub(crate) async fn reconcile_pods(self: &Arc<Self>, runtime: &Arc<dyn Runtime>) -> Result<(), ContainerError> {
        let containers = match runtime.list(&self.own(KIND_POD)).await {
            Ok(list) => list,
            Err(error) => {
                tracing::warn!(%error, "pod containers could not be listed");
                return Ok(());
            }
        };
        let mut by_pod: HashMap<String, RuntimeContainer> = containers
            .into_iter()
            .filter_map(|c| c.labels.get(LABEL_ID).cloned().map(|id| (id, c)))
            .collect();
        let pods = self.service().pods_to_reconcile().await?;
        let known: std::collections::HashSet<String> = pods.iter().map(|p| p.id.clone()).collect();
        for pod in pods {
            if !self.pod_lock(&pod.id) {
                continue; // an engine call of its own is under way
            }
            let container = by_pod.remove(&pod.id);
            let fleet = Arc::clone(self);
            let runtime = Arc::clone(runtime);
            let id = pod.id.clone();
            // Each pod in a task of its own: a stop waits out its grace
            // period, and a pull may take minutes.
            tokio::spawn(async move {
                if let Err(error) = fleet.reconcile_pod(&runtime, &pod, container).await {
                    tracing::warn!(pod = %pod.id, %error, "pod reconcile failed");
                }
                fleet.pod_unlock(&id);
            });
        }
        // Deleted clusters' networks, once their members are gone.
        for (cluster, busy) in self.service().clusters_to_clean().await? {
            if busy {
                continue;
            }
            match runtime.remove_network(&cluster_network_name(&cluster)).await {
                Ok(()) => self.service().cluster_cleaned(&cluster).await?,
                Err(error) => tracing::info!(%cluster, %error, "the cluster's network is not removed yet"),
            }
        }
        // Pod containers with no pod (left by a crash between a start and its
        // record, or of a pod cleaned up already).
        for (pod_id, container) in by_pod {
            if !known.contains(&pod_id) && self.pod_lock(&pod_id) {
                tracing::info!(%pod_id, container = %container.name, "removing a pod container with no pod");
                let _ = runtime.remove(&container.id).await;
                self.pod_unlock(&pod_id);
            }
        }
        Ok(())
    }

    async fn reconcile_pod(
        &self,
        runtime: &Arc<dyn Runtime>,
        pod: &PodRecord,
        container: Option<RuntimeContainer>,
    ) -> Result<(), ContainerError> {
        let service = self.service();
        let version_of = |c: &RuntimeContainer| {
            c.labels
                .get(LABEL_VERSION)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        match pod.desired {
            PodStatus::Terminated => {
                // The run ends before the container goes: a crash in between
                // leaves a container unbilled until the next look removes
                // it, never a run billed for a container already gone.
                let end = match &container {
                    Some(c) if !is_running(c) => stopped_at(runtime, c).await,
                    _ => now_ms(),
                };
                service.close_pod_run(pod, end).await?;
                if let Some(c) = &container {
                    runtime.remove(&c.id).await.map_err(runtime_error)?;
                    service.pod_event(&pod.id, "container removed").await?;
                }
                if pod.spec.mounts.persistent.is_some()
                    && let Err(error) = runtime.remove_volume(&pod_volume_name(&pod.id)).await
                {
                    tracing::warn!(pod = %pod.id, %error, "the pod's volume could not be removed; the next look tries again");
                    return Ok(());
                }
                // Its disk is charged until it is gone.
                service.close_pod_disk(&pod.id, now_ms()).await?;
                service.set_pod_status(pod, PodStatus::Terminated, None, None).await?;
            }
            PodStatus::Exited => {
                if let Some(c) = &container
                    && is_running(c)
                {
                    service.pod_event(&pod.id, "stopping the container").await?;
                    runtime
                        .stop(&c.id, self.config().stop_grace)
                        .await
                        .map_err(runtime_error)?;
                    let code = runtime.inspect(&c.id).await.ok().and_then(|c| c.exit_code);
                    service.close_pod_run(pod, stopped_at(runtime, c).await).await?;
                    service
                        .pod_event(&pod.id, &format!("container stopped{}", exit_text(code)))
                        .await?;
                } else if pod.status != PodStatus::Exited && pod.status != PodStatus::Error {
                    // Stopped already (by itself, or while Gantry was down):
                    // its run ends when the engine says it stopped. A pod long
                    // EXITED writes nothing, look after look.
                    let end = match &container {
                        Some(c) => stopped_at(runtime, c).await,
                        None => now_ms(),
                    };
                    service.close_pod_run(pod, end).await?;
                }
                if pod.status != PodStatus::Exited && pod.status != PodStatus::Error {
                    // What a pod stopped while PROVISIONING waited for (free
                    // GPUs) is no reason for its stop.
                    let reason = match pod.status {
                        PodStatus::Provisioning => None,
                        _ => pod.reason.as_deref(),
                    };
                    service.set_pod_status(pod, PodStatus::Exited, reason, None).await?;
                }
            }
            PodStatus::Running => match container {
                Some(c) if version_of(&c) != pod.version => {
                    service
                        .pod_event(&pod.id, "replacing the container with the new configuration")
                        .await?;
                    let end = if is_running(&c) {
                        now_ms()
                    } else {
                        stopped_at(runtime, &c).await
                    };
                    service.close_pod_run(pod, end).await?;
                    runtime.remove(&c.id).await.map_err(runtime_error)?;
                    // Created anew on the next look.
                    service.set_pod_status(pod, PodStatus::Provisioning, None, None).await?;
                }
                Some(c) if c.state == ContainerState::Dead && c.error.is_some() => {
                    // It will not start as it is (Kubernetes: the image cannot be pulled, the
                    // configuration is refused): ERROR with the reason, and nothing left running
                    // or billed; an update or a start tries again.
                    let reason = format!(
                        "the container could not start: {}",
                        c.error.as_deref().unwrap_or_default()
                    );
                    runtime.remove(&c.id).await.map_err(runtime_error)?;
                    service.pod_exited(pod, PodStatus::Error, &reason).await?;
                }
                Some(c) if c.state == ContainerState::Created => {
                    // Made, not running yet (on Kubernetes: waiting for a node, pulling): billed
                    // from the moment it runs.
                    if pod.status != PodStatus::Starting {
                        service.set_pod_status(pod, PodStatus::Starting, None, None).await?;
                    }
                }
                Some(c)
                    if is_running(&c) && self.config().pod_credit_grace.is_some() && {
                        let balance = gantry_billing::credit::balance(service.db(), &pod.user_id).await?;
                        self.unpaid_past_grace(&pod.id, balance <= 0)
                    } =>
                {
                    // Stopped (not deleted): the owner tops up and starts it.
                    let reason = "stopped: the account's credit ran out";
                    service.pod_event(&pod.id, reason).await?;
                    runtime
                        .stop(&c.id, self.config().stop_grace)
                        .await
                        .map_err(runtime_error)?;
                    service.close_pod_run(pod, stopped_at(runtime, &c).await).await?;
                    service.pod_exited(pod, PodStatus::Exited, reason).await?;
                    self.unpaid_past_grace(&pod.id, false);
                }
                Some(c) if is_running(&c) => {
                    let run = service.open_run_of(&pod.id).await?;
                    match run {
                        Some(run) if pod.restart_at_ms > run.created_at_ms => {
                            service.pod_event(&pod.id, "restarting the container").await?;
                            runtime
                                .stop(&c.id, self.config().stop_grace)
                                .await
                                .map_err(runtime_error)?;
                            service.close_pod_run(pod, stopped_at(runtime, &c).await).await?;
                            self.start_existing(runtime, pod, &c).await?;
                        }
                        Some(_) => {
                            if pod.status != PodStatus::Running {
                                service.set_pod_status(pod, PodStatus::Running, None, None).await?;
                            }
                        }
                        None => {
                            // Running with no open run: it has just started
                            // (Kubernetes starts a pod after `run` returns), or
                            // it is adopted after a restart of Gantry that
                            // closed nothing. Billed from the engine's start.
                            let started = started_at(runtime, &c).await;
                            service.open_pod_run(pod, started).await?;
                            service
                                .set_pod_status(pod, PodStatus::Running, None, Some(started))
                                .await?;
                            if pod.status == PodStatus::Starting {
                                service.pod_event(&pod.id, "container started").await?;
                            }
                        }
                    }
                }
                Some(c) if pod.status == PodStatus::Provisioning => {
                    // Started again by its owner: same container, same files.
                    self.start_existing(runtime, pod, &c).await?;
                }
                Some(c) => {
                    // One inspect gives when it last started and stopped, and
                    // its exit status (a listing has none of them).
                    let c = runtime.inspect(&c.id).await.unwrap_or(c);
                    let stopped = stopped_ms(&c);
                    // Stopped by the engine going down, not by its program:
                    // either this process saw the engine away around the
                    // stop, or the container last started under an earlier
                    // instance of the engine. The second covers what the
                    // first cannot: an engine restarted within one look, and
                    // Gantry and the engine down together (a reboot).
                    let engine_start = match pod.status {
                        PodStatus::Running => engine_started_at(runtime).await,
                        _ => None,
                    };
                    let started_under_another = match engine_start {
                        Some(engine) => last_started_ms(runtime, &c)
                            .await
                            .is_some_and(|started| started < engine),
                        None => false,
                    };
                    let by_the_engine =
                        pod.status == PodStatus::Running && (self.stopped_in_outage(stopped) || started_under_another);
                    // An engine on its way down may still answer while it
                    // stops its containers: a stop this recent is decided on
                    // a later look, once it is known whether the engine went
                    // away around it.
                    if pod.status == PodStatus::Running && !by_the_engine && now_ms() - stopped < OUTAGE_MARGIN_MS {
                        return Ok(());
                    }
                    if by_the_engine {
                        // The pod comes back as it was, on the same container.
                        // Billed up to the stop, and again from the start. A
                        // host that went down without stopping the container
                        // leaves the engine to record the stop when it starts
                        // again: the run ends no later than the engine's start.
                        let end = engine_start.map_or(stopped, |engine| stopped.min(engine));
                        service.close_pod_run(pod, end).await?;
                        service
                            .pod_event(
                                &pod.id,
                                "the container engine stopped the container while it was away; starting it again",
                            )
                            .await?;
                        self.start_existing(runtime, pod, &c).await?;
                    } else {
                        // It stopped by itself (perhaps while Gantry was down):
                        // billed up to when the engine says it did.
                        service.close_pod_run(pod, stopped).await?;
                        service
                            .pod_exited(
                                pod,
                                PodStatus::Exited,
                                &format!("container exited{}", exit_text(c.exit_code)),
                            )
                            .await?;
                    }
                }
                None => {
                    if pod.status == PodStatus::Error {
                        return Ok(()); // waits for a fix (an update) or a start
                    }
                    self.create_pod_container(runtime, pod).await?;
                }
            },
            PodStatus::Provisioning | PodStatus::Starting | PodStatus::Error => {}
        }
        Ok(())
    }

    async fn start_existing(
        &self,
        runtime: &Arc<dyn Runtime>,
        pod: &PodRecord,
        c: &RuntimeContainer,
    ) -> Result<(), ContainerError> {
        let service = self.service();
        // Its GPUs are its own again only once no other container has them.
        let own_gpus = crate::gpus::devices_of(&c.labels);
        let _held = if own_gpus.is_empty() {
            None
        } else {
            let in_use = self.gpus_in_use(runtime, Some(&c.id)).await?;
            match self.gpu_pool.reserve_these(&own_gpus, &in_use) {
                Ok(held) => Some(held),
                Err(reason) => return self.wait_for_gpus(pod, &reason).await,
            }
        };
        if let Err(error) = runtime.start(&c.id).await {
            let reason = format!("the container could not start: {error}");
            return service.pod_exited(pod, PodStatus::Error, &reason).await;
        }
        if runtime
            .inspect(&c.id)
            .await
            .is_ok_and(|c| c.state == ContainerState::Created)
        {
            // Made again, not running yet (Kubernetes): billed once it runs.
            service.set_pod_status(pod, PodStatus::Starting, None, None).await?;
            return service
                .pod_event(&pod.id, "container created; waiting for it to start")
                .await;
        }
        let now = now_ms();
        service.open_pod_run(pod, now).await?;
        service.set_pod_status(pod, PodStatus::Running, None, Some(now)).await?;
        service.pod_event(&pod.id, "container started").await
    }

    async fn create_pod_container(&self, runtime: &Arc<dyn Runtime>, pod: &PodRecord) -> Result<(), ContainerError> {
        let service = self.service();
        let image = &pod.spec.container.image;
        let auth = match &pod.spec.container.registry {
            Some(id) => match service.credentials(&pod.user_id, id).await {
                Ok((username, password)) => Some(RegistryAuth {
                    username,
                    password,
                    server: registry_host(image),
                }),
                Err(error) => {
                    let reason = format!("registry credential {id}: {error}");
                    return service.pod_exited(pod, PodStatus::Error, &reason).await;
                }
            },
            None => None,
        };
        // Its GPUs are chosen first, and held through the pull until the
        // container has them.
        let gpus = match self.grant_gpus(runtime, pod.spec.gpu_count()).await? {
            Grant::ByCount => None,
            Grant::Devices(held) => Some(held),
            Grant::Wait(reason) => return self.wait_for_gpus(pod, &reason).await,
            Grant::Never(reason) => return service.pod_exited(pod, PodStatus::Error, &reason).await,
        };
        service.set_pod_status(pod, PodStatus::Starting, None, None).await?;
        service.pod_event(&pod.id, &format!("pulling image {image}")).await?;
        if let Err(error) = runtime.ensure_image(image, auth.as_ref()).await {
            let reason = format!("image {image} could not be pulled: {error}");
            return service.pod_exited(pod, PodStatus::Error, &reason).await;
        }
        let mut spec = self.pod_container_spec(pod);
        if let Some(held) = &gpus {
            spec.gpu_devices = held.devices.clone();
            spec.labels.insert(LABEL_GPUS.to_owned(), held.devices.join(","));
        }
        // Volumes are made at their sizes where the runtime sizes them (Kubernetes claims).
        if let Some(mount) = &pod.spec.mounts.persistent {
            spec.volume_sizes_gb.insert(pod_volume_name(&pod.id), mount.size);
        }
        for mount in &pod.spec.mounts.network {
            if let Some(size) = service.volume_size_gb(&mount.volume_id).await? {
                spec.volume_sizes_gb.insert(network_volume_name(&mount.volume_id), size);
            }
        }
        if let Network::Private { name, .. } = &spec.network {
            let mut labels = BTreeMap::new();
            labels.insert(LABEL_INSTALLATION.to_owned(), self.installation().to_owned());
            labels.insert(LABEL_OWNER.to_owned(), pod.user_id.clone());
            let made = {
                let _one_at_a_time = self.networks.lock().await;
                runtime.ensure_network(name, &labels).await
            };
            if let Err(error) = made {
                let reason = format!("the cluster's network could not be made: {error}");
                return service.pod_exited(pod, PodStatus::Error, &reason).await;
            }
        }
        match runtime.run(&spec).await {
            Ok(id)
                if runtime
                    .inspect(&id)
                    .await
                    .is_ok_and(|c| c.state == ContainerState::Created) =>
            {
                // Accepted, not started yet (a Kubernetes pod waits for a node and its image):
                // the next looks see it run.
                service
                    .pod_event(&pod.id, "container created; waiting for it to start")
                    .await?;
                tracing::info!(pod = %pod.id, container = %id, "pod created");
                Ok(())
            }
            Ok(id) => {
                let now = now_ms();
                service.open_pod_run(pod, now).await?;
                service.set_pod_status(pod, PodStatus::Running, None, Some(now)).await?;
                service.pod_event(&pod.id, "container started").await?;
                tracing::info!(pod = %pod.id, container = %id, "pod started");
                Ok(())
            }
            Err(error) => {
                let reason = format!("the container could not start: {error}");
                service.pod_exited(pod, PodStatus::Error, &reason).await
            }
        }
    }

    /// The pod waits, PROVISIONING, for GPUs that other containers have; the
    /// reason is its status reason and, once, a line of its log. Each look
    /// tries again.
    async fn wait_for_gpus(&self, pod: &PodRecord, reason: &str) -> Result<(), ContainerError> {
        if pod.status == PodStatus::Provisioning && pod.reason.as_deref() == Some(reason) {
            return Ok(());
        }
        let service = self.service();
        service
            .set_pod_status(pod, PodStatus::Provisioning, Some(reason), None)
            .await?;
        service.pod_event(&pod.id, reason).await
    }

    /// The container of a pod: its image, args and env, its persistent
    /// volume, its ports on loopback, its compute limits.
    pub fn pod_container_spec(&self, pod: &PodRecord) -> ContainerSpec {
        let spec = &pod.spec;
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_KIND.to_owned(), KIND_POD.to_owned());
        labels.insert(LABEL_INSTALLATION.to_owned(), self.installation().to_owned());
        labels.insert(LABEL_ID.to_owned(), pod.id.clone());
        labels.insert(LABEL_OWNER.to_owned(), pod.user_id.clone());
        labels.insert(LABEL_VERSION.to_owned(), pod.version.to_string());
        let args = split_args(&spec.container.args).unwrap_or_default();
        let binds = spec
            .mounts
            .persistent
            .iter()
            .map(|mount| format!("{}:{}", pod_volume_name(&pod.id), mount.path))
            .chain(
                spec.mounts
                    .network
                    .iter()
                    .map(|mount| format!("{}:{}", network_volume_name(&mount.volume_id), mount.path)),
            )
            .collect();
        let ports = spec
            .container
            .ports
            .iter()
            .filter_map(|p| crate::spec::parse_port(p).ok())
            .map(|p| gantry_runtime::PortSpec {
                container: p.number,
                protocol: if p.protocol == crate::spec::PortProtocol::Udp {
                    gantry_runtime::Protocol::Udp
                } else {
                    gantry_runtime::Protocol::Tcp
                },
                host_ip: "127.0.0.1".to_owned(),
                host_port: 0,
            })
            .collect();
        ContainerSpec {
            name: pod_container_name(&pod.id),
            image: spec.container.image.clone(),
            cmd: (!args.is_empty()).then_some(args),
            env: pod_env(pod),
            labels,
            // A cluster's members share a network of their own, where each is `node-<rank>`.
            network: match &spec.cluster {
                Some(member) => Network::Private {
                    name: cluster_network_name(&member.id),
                    aliases: vec![member.host()],
                },
                None if self.config().host_network => Network::Host,
                None => Network::Bridge {
                    extra_hosts: Vec::new(),
                },
            },
            hostname: spec.cluster.as_ref().map(|member| member.host()),
            volume_sizes_gb: BTreeMap::new(),
            ports,
            memory_bytes: spec.cpu.as_ref().map(|cpu| u64::from(cpu.memory) << 30),
            nano_cpus: spec.cpu.as_ref().map(|cpu| u64::from(cpu.vcpu_count) * 1_000_000_000),
            gpus: spec.gpu_count(),
            gpu_devices: Vec::new(),
            binds,
            stop_timeout_secs: Some(u32::try_from(self.config().stop_grace.as_secs()).unwrap_or(10)),
            auto_remove: false,
            tty: false,
            // Its GPU type, where the runtime chooses among machines (Kubernetes).
            placement: gantry_runtime::Placement {
                gpu_types: spec.gpu.iter().map(|gpu| gpu.id.clone()).collect(),
                ..gantry_runtime::Placement::default()
            },
        }
    }
}

/// When a stopped container stopped, as the engine recorded it (ms); now if
/// the engine does not say. Never later than now.
async fn stopped_at(runtime: &Arc<dyn Runtime>, c: &RuntimeContainer) -> i64 {
    match runtime.inspect(&c.id).await {
        Ok(inspected) => stopped_ms(&inspected),
        Err(_) => now_ms(),
    }
}

/// When an inspected container stopped, as the engine recorded it (ms); now
/// if it does not say. Never later than now.
fn stopped_ms(c: &RuntimeContainer) -> i64 {
    let now = now_ms();
    c.finished_at
        .as_deref()
        .and_then(gantry_runtime::parse_rfc3339_nanos)
        .map_or(now, |ns| ns.div_euclid(1_000_000).min(now))
}

/// When a running container started, as the engine recorded it (ms); now if
/// the engine does not say. Never later than now.
async fn started_at(runtime: &Arc<dyn Runtime>, c: &RuntimeContainer) -> i64 {
    let now = now_ms();
    last_started_ms(runtime, c).await.map_or(now, |ms| ms.min(now))
}

/// When the engine now answering started, where it can tell.
async fn engine_started_at(runtime: &Arc<dyn Runtime>) -> Option<i64> {
    runtime.started_at().await.unwrap_or_else(|error| {
        tracing::debug!(%error, "the engine's start could not be read");
        None
    })
}

/// When a container last started (ms), as the engine recorded it.
async fn last_started_ms(runtime: &Arc<dyn Runtime>, c: &RuntimeContainer) -> Option<i64> {
    let started = match &c.started_at {
        Some(at) => Some(at.clone()),
        None => runtime.inspect(&c.id).await.ok()?.started_at,
    };
    started
        .as_deref()
        .and_then(gantry_runtime::parse_rfc3339_nanos)
        .map(|ns| ns.div_euclid(1_000_000))
}

fn is_running(c: &RuntimeContainer) -> bool {
    matches!(c.state, ContainerState::Running | ContainerState::Restarting)
}

fn exit_text(code: Option<i64>) -> String {
    match code {
        Some(137) => " with status 137 (killed: out of memory, or stopped by force)".to_owned(),
        Some(code) => format!(" with status {code}"),
        None => String::new(),
    }
}

fn runtime_error(error: gantry_runtime::RuntimeError) -> ContainerError {
    ContainerError::Runtime(error.to_string())
}
