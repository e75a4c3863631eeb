//! One list of this node's pods, for the tools (`nri-qos audit`): no watch,
//! no thread, and an answer within a bound.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::client::client;
use super::facts::{self, ApiPodFacts};
use super::{Credentials, KubeError};

/// The pods bound to `node_name`, reduced to their facts; pods whose spec
/// is not understood are left out (their facts come from the runtime), as
/// in the watch. Gives up after `limit`, client set-up included.
pub async fn list_node_pods(
    credentials: &Credentials,
    node_name: &str,
    limit: Duration,
) -> Result<Vec<ApiPodFacts>, KubeError> {
    let list = async {
        let api: Api<Pod> = Api::all(client(credentials).await?);
        let params = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
        api.list(&params).await.map_err(KubeError::Client)
    };
    let pods = tokio::time::timeout(limit, list)
        .await
        .map_err(|_| KubeError::Timeout(limit))??;
    Ok(pods
        .items
        .iter()
        .filter_map(|p| facts::from_api(p).ok())
        .collect())
}
