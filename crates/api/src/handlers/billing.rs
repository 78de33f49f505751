//! Billing: the caller's credit balance and billing history.
use actix_web::{HttpRequest, HttpResponse, web};
use gantry_auth::Scope;
use gantry_billing::credit::usd_string;
use gantry_billing::history::{BucketSize, Compute, Part, Window, format_rfc3339};
use gantry_billing::usd;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::middleware::Caller;
use crate::problem::ApiError;
use crate::query::{self, Between, One, RequestQuery, Time, parse_query};
use crate::state::AppState;

/// A credit balance. Amounts are exact decimal strings in USD (6 decimals).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Balance {
    /// Credit added minus every charge.
    #[schema(example = "12.345678")]
    pub balance_usd: String,
    /// The most the caller's queued and running jobs may still cost.
    #[schema(example = "0.081920")]
    pub held_usd: String,
    /// `balanceUsd − heldUsd`: a job is accepted only while this is above zero
    /// (when the server requires credit).
    #[schema(example = "12.263758")]
    pub available_usd: String,
    /// Whether jobs are refused (`402`) without available credit.
    pub credit_required: bool,
}

#[utoipa::path(get, path = "/v2/billing/balance", operation_id = "getBalance", tag = "Billing",
    description = "The caller's credit balance in USD, what their jobs in flight may still cost, and what is \
available for new jobs. Top-ups are made by an operator (`gantry users add-credit EMAIL USD`); every completed \
job's cost is debited in the transaction that completes it. Requires `billing:read`.",
    responses((status = 200, description = "OK", body = Balance)))]
pub async fn balance(state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Scope::BillingRead)?;
    let (balance, held) = state.census.credit(&principal.user_id).await?;
    Ok(HttpResponse::Ok().json(Balance {
        balance_usd: usd_string(balance),
        held_usd: usd_string(held),
        available_usd: usd_string(balance.saturating_sub(held)),
        credit_required: state.jobs.config().require_credit,
    }))
}

/// A billing history route's query, valid: its window and, where the route
/// takes one, the subject it keeps (`serverlessId`, `podId`, …).
struct History {
    window: Window,
    subject: Option<String>,
}

/// The query type of a billing history route: the window parameters every
/// route takes, plus the route's own subject filter where it has one.
macro_rules! history_query {
    ($name:ident $(, $subject:ident: $what:literal)?) => {
        #[derive(Deserialize, IntoParams)]
        #[serde(rename_all = "camelCase")]
        #[into_params(parameter_in = Query)]
        struct $name {
            /// Start (RFC 3339), inclusive.
            #[serde(default, deserialize_with = "query::value")]
            #[param(inline)]
            start_time: Option<Time>,
            /// End (RFC 3339), exclusive.
            #[serde(default, deserialize_with = "query::value")]
            #[param(inline)]
            end_time: Option<Time>,
            /// hour, day, week, month or year (default day).
            #[serde(default, deserialize_with = "query::value")]
            #[param(inline)]
            bucket_size: Option<One<Bucket>>,
            /// The last N buckets, ending with the current one.
            #[serde(default, deserialize_with = "query::value")]
            #[param(inline)]
            last_n: Option<Between<1, 10_000>>,
            $(
                #[doc = $what]
                #[serde(default, deserialize_with = "query::value")]
                #[param(min_length = 1)]
                $subject: Option<String>,
            )?
        }

        impl RequestQuery for $name {
            type Valid = History;

            fn validate(self, failures: &mut Vec<String>) -> Option<History> {
                let window = Window::resolve(
                    self.start_time.map(|t| t.0),
                    self.end_time.map(|t| t.0),
                    self.last_n.map(|n| n.0),
                    self.bucket_size.map_or(BucketSize::Day, |b| b.0.size()),
                    gantry_jobs::now_ms(),
                )
                .map_err(|errors| failures.extend(errors))
                .ok()?;
                let subject: Option<String> = None $(.or(self.$subject))?;
                Some(History { window, subject })
            }
        }
    };
}

history_query!(WindowQuery);
history_query!(ServerlessQuery, serverless_id: "One endpoint only");
history_query!(PodQuery, pod_id: "One pod only");
history_query!(ClusterQuery, cluster_id: "One cluster only");
history_query!(VolumeQuery, network_volume_id: "One volume only");

/// A bucket's size as the query names it.
#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Bucket {
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Bucket {
    fn size(self) -> BucketSize {
        match self {
            Bucket::Hour => BucketSize::Hour,
            Bucket::Day => BucketSize::Day,
            Bucket::Week => BucketSize::Week,
            Bucket::Month => BucketSize::Month,
            Bucket::Year => BucketSize::Year,
        }
    }
}

fn query_echo(window: &Window) -> Value {
    json!({
        "startTime": format_rfc3339(window.start),
        "endTime": format_rfc3339(window.end),
        "bucketSize": window.bucket.as_str(),
    })
}

fn range(bucket: (i64, i64)) -> serde_json::Map<String, Value> {
    let mut record = serde_json::Map::new();
    record.insert("startTime".into(), format_rfc3339(bucket.0).into());
    record.insert("endTime".into(), format_rfc3339(bucket.1).into());
    record
}

/// The cost components of `GET /v2/billing` that Gantry does not charge
/// (serverless disk and fees, clusters' networking): always 0.
const ABSENT_COMPONENTS: [&str; 3] = ["serverlessDiskAmount", "serverlessFeeAmount", "clusterNetworkingAmount"];

/// Sums per bucket, in micro-USD: endpoint (model jobs), standard storage,
/// high-performance storage, serverless GPU workers, serverless CPU workers.
#[derive(Clone, Copy, Default)]
struct Sums {
    endpoint: i64,
    standard: i64,
    high: i64,
    serverless_gpu: i64,
    serverless_cpu: i64,
    pod_gpu: i64,
    pod_cpu: i64,
    pod_disk: i64,
    /// Cluster members' time (GPU) and stopped disk.
    cluster_gpu: i64,
    cluster_disk: i64,
}

impl std::ops::AddAssign for Sums {
    fn add_assign(&mut self, other: Sums) {
        self.endpoint += other.endpoint;
        self.standard += other.standard;
        self.high += other.high;
        self.serverless_gpu += other.serverless_gpu;
        self.serverless_cpu += other.serverless_cpu;
        self.pod_gpu += other.pod_gpu;
        self.pod_cpu += other.pod_cpu;
        self.pod_disk += other.pod_disk;
        self.cluster_gpu += other.cluster_gpu;
        self.cluster_disk += other.cluster_disk;
    }
}

fn aggregate_amounts(sums: Sums) -> serde_json::Map<String, Value> {
    let Sums {
        endpoint,
        standard,
        high,
        serverless_gpu,
        serverless_cpu,
        pod_gpu,
        pod_cpu,
        pod_disk,
        cluster_gpu,
        cluster_disk,
    } = sums;
    let mut amounts = serde_json::Map::new();
    amounts.insert(
        "totalAmount".into(),
        usd(endpoint
            + standard
            + high
            + serverless_gpu
            + serverless_cpu
            + pod_gpu
            + pod_cpu
            + pod_disk
            + cluster_gpu
            + cluster_disk)
        .into(),
    );
    amounts.insert("clusterGpuAmount".into(), usd(cluster_gpu).into());
    amounts.insert("clusterDiskAmount".into(), usd(cluster_disk).into());
    amounts.insert("podGpuAmount".into(), usd(pod_gpu).into());
    amounts.insert("podCpuAmount".into(), usd(pod_cpu).into());
    amounts.insert("podDiskAmount".into(), usd(pod_disk).into());
    amounts.insert("serverlessGpuAmount".into(), usd(serverless_gpu).into());
    amounts.insert("serverlessCpuAmount".into(), usd(serverless_cpu).into());
    for component in ABSENT_COMPONENTS {
        amounts.insert(component.into(), 0.0.into());
    }
    amounts.insert("storageStandardAmount".into(), usd(standard).into());
    amounts.insert("storageHighPerformanceAmount".into(), usd(high).into());
    amounts.insert("endpointAmount".into(), usd(endpoint).into());
    amounts
}

#[utoipa::path(get, path = "/v2/billing", operation_id = "listBilling", tag = "Billing",
    description = "Total spend per time bucket, with its components: `endpointAmount` (model jobs), \
`storageStandardAmount` and `storageHighPerformanceAmount` (network volumes), `serverlessGpuAmount` and \
`serverlessCpuAmount` (serverless workers' time), `podGpuAmount` and `podCpuAmount` (pods' running time), \
`podDiskAmount` (stopped pods' disk), `clusterGpuAmount` and `clusterDiskAmount` (clusters' members, which the pod \
components leave out); serverless disk and fees and cluster networking are 0 (Gantry does not charge them). See `/v2/billing/endpoints` for the query parameters.",
    params(WindowQuery),
    responses((status = 200, description = "Records per bucket and totals")))]
pub async fn history(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let user = caller.require(Scope::BillingRead)?.user_id.clone();
    let window = parse_query::<WindowQuery>(&req)?.window;
    let buckets = window.buckets();
    let mut sums: Vec<Sums> = vec![Sums::default(); buckets.len()];
    for (at, amount) in gantry_billing::history::job_charges(&state.db, &user, &window).await? {
        if let Some(i) = window.index_of(&buckets, at) {
            sums[i].endpoint += amount;
        }
    }
    for (at, _, tier, amount) in gantry_billing::history::storage_charges(&state.db, &user, &window, None).await? {
        if let Some(i) = window.index_of(&buckets, at) {
            if tier == "HIGH_PERFORMANCE" {
                sums[i].high += amount;
            } else {
                sums[i].standard += amount;
            }
        }
    }
    let clusters = state.containers.cluster_of_pods(&user).await?;
    for compute in [Compute::Workers, Compute::Pods] {
        let charges = gantry_billing::history::compute_charges(&state.db, &user, &window, compute, None).await?;
        for (at, subject, part, amount) in charges {
            if let Some(i) = window.index_of(&buckets, at) {
                let sum = &mut sums[i];
                let member = compute == Compute::Pods && clusters.contains_key(&subject);
                let slot = match (compute, part) {
                    // A cluster member's time is the cluster's.
                    (Compute::Pods, Part::Gpu | Part::Cpu) if member => &mut sum.cluster_gpu,
                    (Compute::Pods, Part::Disk) if member => &mut sum.cluster_disk,
                    (Compute::Workers, Part::Gpu) => &mut sum.serverless_gpu,
                    (Compute::Workers, Part::Cpu | Part::Disk) => &mut sum.serverless_cpu,
                    (Compute::Pods, Part::Gpu) => &mut sum.pod_gpu,
                    (Compute::Pods, Part::Cpu) => &mut sum.pod_cpu,
                    (Compute::Pods, Part::Disk) => &mut sum.pod_disk,
                };
                *slot += amount;
            }
        }
    }
    let mut records = Vec::with_capacity(buckets.len());
    let mut total = Sums::default();
    for (bucket, sum) in buckets.iter().zip(&sums) {
        let mut record = range(*bucket);
        record.extend(aggregate_amounts(*sum));
        records.push(Value::Object(record));
        total += *sum;
    }
    Ok(HttpResponse::Ok().json(json!({
        "records": records,
        "metadata": {
            "query": query_echo(&window),
            "recordCount": records.len(),
            "totals": Value::Object(aggregate_amounts(total)),
        }
    })))
}

#[utoipa::path(get, path = "/v2/billing/endpoints", operation_id = "listEndpointBilling", tag = "Billing",
    description = "What the caller's model jobs cost per time bucket (`totalAmount`), from the ledger of charges \
(one per completed job, written with its completion). Query: `startTime`/`endTime` (RFC 3339, half-open; default \
the last 30 days, snapped outward to bucket boundaries) or `lastN` buckets ending with the current one; \
`bucketSize` hour, day (default), week (ISO, from Monday), month or year, in UTC. Amounts are USD; each is an exact \
sum of micro-dollar charges, so the records add up to the totals. Bad parameters are `400` with every failure \
listed. Requires `billing:read`.",
    params(WindowQuery),
    responses((status = 200, description = "Records per bucket and totals")))]
pub async fn endpoints(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let user = caller.require(Scope::BillingRead)?.user_id.clone();
    let window = parse_query::<WindowQuery>(&req)?.window;
    let buckets = window.buckets();
    let mut sums = vec![0i64; buckets.len()];
    for (at, amount) in gantry_billing::history::job_charges(&state.db, &user, &window).await? {
        if let Some(i) = window.index_of(&buckets, at) {
            sums[i] += amount;
        }
    }
    let records: Vec<Value> = buckets
        .iter()
        .zip(&sums)
        .map(|(bucket, sum)| {
            let mut record = range(*bucket);
            record.insert("totalAmount".into(), usd(*sum).into());
            Value::Object(record)
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "records": records,
        "metadata": {
            "query": query_echo(&window),
            "recordCount": records.len(),
            "totals": {"totalAmount": usd(sums.iter().sum())},
        }
    })))
}

#[utoipa::path(get, path = "/v2/billing/serverless", operation_id = "listServerlessBilling", tag = "Billing",
    description = "What the caller's serverless endpoints cost per time bucket: one record per endpoint per bucket \
in which it was charged (each worker is charged per second while it exists, at the catalog's serverless price of its \
GPUs or vCPUs), split into `gpuAmount` and `cpuAmount` (`diskAmount` and `feeAmount` are 0: not charged). \
`serverlessId` keeps one endpoint (deleted ones included). See `/v2/billing/endpoints` for the other parameters.",
    params(ServerlessQuery),
    responses((status = 200, description = "Records per endpoint and bucket, and totals")))]
pub async fn serverless(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    compute_history(&req, &state, &caller, Compute::Workers).await
}

#[utoipa::path(get, path = "/v2/billing/pods", operation_id = "listPodBilling", tag = "Billing",
    description = "What the caller's pods cost per time bucket: one record per pod per bucket in which it was \
charged (a pod is charged per second while its container runs, at the catalog's price of its GPUs or vCPUs for its \
cloud), split into `gpuAmount` and `cpuAmount`, and `diskAmount`: a stopped pod's container disk and volume, \
charged per second from the end of a run until the next start or its termination at \
`billing.storage.stopped_pod_disk_micro_usd_per_gb_month`). `podId` keeps one pod (deleted ones included). See `/v2/billing/endpoints` for the other parameters.",
    params(PodQuery),
    responses((status = 200, description = "Records per pod and bucket, and totals")))]
pub async fn pods(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    compute_history(&req, &state, &caller, Compute::Pods).await
}

/// Per-second compute (serverless workers or pods) per bucket and subject.
async fn compute_history(
    req: &HttpRequest,
    state: &AppState,
    caller: &Caller,
    compute: Compute,
) -> Result<HttpResponse, ApiError> {
    let user = caller.require(Scope::BillingRead)?.user_id.clone();
    let (param, unique) = match compute {
        Compute::Workers => ("serverlessId", "uniqueServerlessCount"),
        Compute::Pods => ("podId", "uniquePodCount"),
    };
    let History { window, subject } = match compute {
        Compute::Workers => parse_query::<ServerlessQuery>(req)?,
        Compute::Pods => parse_query::<PodQuery>(req)?,
    };
    let buckets = window.buckets();
    // (bucket, subject) -> (gpu, cpu, disk)
    let mut sums: std::collections::BTreeMap<(usize, String), (i64, i64, i64)> = std::collections::BTreeMap::new();
    let charges =
        gantry_billing::history::compute_charges(&state.db, &user, &window, compute, subject.as_deref()).await?;
    // Clusters' members are billed as their clusters (`/v2/billing/clusters`).
    let members = match compute {
        Compute::Pods => state.containers.cluster_of_pods(&user).await?,
        Compute::Workers => std::collections::HashMap::new(),
    };
    for (at, id, part, amount) in charges {
        if members.contains_key(&id) {
            continue;
        }
        if let Some(i) = window.index_of(&buckets, at) {
            let entry = sums.entry((i, id)).or_default();
            match part {
                Part::Gpu => entry.0 += amount,
                Part::Cpu => entry.1 += amount,
                Part::Disk => entry.2 += amount,
            }
        }
    }
    let mut subjects = std::collections::BTreeSet::new();
    let (mut gpu_total, mut cpu_total, mut disk_total) = (0i64, 0i64, 0i64);
    let amounts = |gpu: i64, cpu: i64, disk: i64| {
        let mut amounts = serverless_amounts(gpu, cpu, disk);
        if compute == Compute::Pods {
            amounts.remove("feeAmount");
        }
        amounts
    };
    let records: Vec<Value> = sums
        .iter()
        .map(|((i, id), (gpu, cpu, disk))| {
            subjects.insert(id.clone());
            gpu_total += gpu;
            cpu_total += cpu;
            disk_total += disk;
            let mut record = range(buckets[*i]);
            record.extend(amounts(*gpu, *cpu, *disk));
            record.insert(param.into(), id.clone().into());
            Value::Object(record)
        })
        .collect();
    let mut echo = query_echo(&window);
    echo[param] = subject.map_or(Value::Null, Value::String);
    Ok(HttpResponse::Ok().json(json!({
        "records": records,
        "metadata": {
            "query": echo,
            "recordCount": records.len(),
            unique: subjects.len(),
            "totals": Value::Object(amounts(gpu_total, cpu_total, disk_total)),
        }
    })))
}

#[utoipa::path(get, path = "/v2/billing/clusters", operation_id = "listClusterBilling", tag = "Billing",
    description = "What the caller's clusters cost per time bucket: one record per cluster per bucket in which it was \
charged. A cluster's members are billed as pods (per second while their containers run, at their GPUs' price; a \
stopped member's disk per second), and their charges are the cluster's: `gpuAmount` and `diskAmount`; \
`networkingAmount` is 0 (Gantry does not charge it). `clusterId` keeps one cluster (deleted ones included). See \
`/v2/billing/endpoints` for the other parameters.",
    params(ClusterQuery),
    responses((status = 200, description = "Records per cluster and bucket, and totals")))]
pub async fn clusters(req: HttpRequest, state: web::Data<AppState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let user = caller.require(Scope::BillingRead)?.user_id.clone();
    let History {
        window,
        subject: cluster_id,
    } = parse_query::<ClusterQuery>(&req)?;
    let buckets = window.buckets();
    let members = state.containers.cluster_of_pods(&user).await?;
    let charges = gantry_billing::history::compute_charges(&state.db, &user, &window, Compute::Pods, None).await?;
    // (bucket, cluster) -> (gpu, disk)
    let mut sums: std::collections::BTreeMap<(usize, String), (i64, i64)> = std::collections::BTreeMap::new();
    for (at, pod, part, amount) in charges {
        let Some(cluster) = members.get(&pod) else {
            continue;
        };
        if cluster_id.as_ref().is_some_and(|wanted| wanted != cluster) {
            continue;
        }
        if let Some(i) = window.index_of(&buckets, at) {
            let entry = sums.entry((i, cluster.clone())).or_default();
            match part {
                Part::Gpu | Part::Cpu => entry.0 += amount,
                Part::Disk => entry.1 += amount,
            }
        }
    }
    let amounts = |gpu: i64, disk: i64| json!({"totalAmount": usd(gpu + disk), "gpuAmount": usd(gpu), "diskAmount": usd(disk), "networkingAmount": 0.0});
    let mut ids = std::collections::BTreeSet::new();
    let (mut gpu_total, mut disk_total) = (0i64, 0i64);
    let records: Vec<Value> = sums
        .iter()
        .map(|((i, id), (gpu, disk))| {
            ids.insert(id.clone());
            gpu_total += gpu;
            disk_total += disk;
            let mut record = range(buckets[*i]);
            if let Value::Object(parts) = amounts(*gpu, *disk) {
                record.extend(parts);
            }
            record.insert("clusterId".into(), id.clone().into());
            Value::Object(record)
        })
        .collect();
    let mut echo = query_echo(&window);
    echo["clusterId"] = cluster_id.map_or(Value::Null, Value::String);
    Ok(HttpResponse::Ok().json(json!({
        "records": records,
        "metadata": {
            "query": echo,
            "recordCount": records.len(),
            "uniqueClusterCount": ids.len(),
            "totals": amounts(gpu_total, disk_total),
        }
    })))
}

fn serverless_amounts(gpu: i64, cpu: i64, disk: i64) -> serde_json::Map<String, Value> {
    let mut amounts = serde_json::Map::new();
    amounts.insert("totalAmount".into(), usd(gpu + cpu + disk).into());
    amounts.insert("gpuAmount".into(), usd(gpu).into());
    amounts.insert("cpuAmount".into(), usd(cpu).into());
    amounts.insert("diskAmount".into(), usd(disk).into());
    amounts.insert("feeAmount".into(), 0.0.into());
    amounts
}

#[utoipa::path(get, path = "/v2/billing/network-volumes", operation_id = "listNetworkVolumeBilling", tag = "Billing",
    description = "What the caller's network volumes cost per time bucket: one record per volume per bucket in \
which it was charged (volumes are charged by the started hour, at the size and tier they had then, until they are \
deleted), split into `standardAmount` and `highPerformanceAmount`. `networkVolumeId` keeps one volume (deleted \
ones included).",
    params(VolumeQuery),
    responses((status = 200, description = "Records per volume and bucket, and totals")))]
pub async fn network_volumes(
    req: HttpRequest,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let user = caller.require(Scope::BillingRead)?.user_id.clone();
    let History {
        window,
        subject: network_volume_id,
    } = parse_query::<VolumeQuery>(&req)?;
    let buckets = window.buckets();
    // (bucket, volume) -> (standard, high performance)
    let mut sums: std::collections::BTreeMap<(usize, String), (i64, i64)> = std::collections::BTreeMap::new();
    let charges =
        gantry_billing::history::storage_charges(&state.db, &user, &window, network_volume_id.as_deref()).await?;
    for (at, volume, tier, amount) in charges {
        if let Some(i) = window.index_of(&buckets, at) {
            let entry = sums.entry((i, volume)).or_default();
            if tier == "HIGH_PERFORMANCE" {
                entry.1 += amount;
            } else {
                entry.0 += amount;
            }
        }
    }
    let mut volumes = std::collections::BTreeSet::new();
    let (mut standard_total, mut high_total) = (0i64, 0i64);
    let records: Vec<Value> = sums
        .iter()
        .map(|((i, volume), (standard, high))| {
            volumes.insert(volume.clone());
            standard_total += standard;
            high_total += high;
            let mut record = range(buckets[*i]);
            record.insert("totalAmount".into(), usd(standard + high).into());
            record.insert("standardAmount".into(), usd(*standard).into());
            record.insert("highPerformanceAmount".into(), usd(*high).into());
            record.insert("networkVolumeId".into(), volume.clone().into());
            Value::Object(record)
        })
        .collect();
    let mut echo = query_echo(&window);
    echo["networkVolumeId"] = network_volume_id.map_or(Value::Null, Value::String);
    Ok(HttpResponse::Ok().json(json!({
        "records": records,
        "metadata": {
            "query": echo,
            "recordCount": records.len(),
            "uniqueNetworkVolumeCount": volumes.len(),
            "totals": {
                "totalAmount": usd(standard_total + high_total),
                "standardAmount": usd(standard_total),
                "highPerformanceAmount": usd(high_total),
            },
        }
    })))
}
