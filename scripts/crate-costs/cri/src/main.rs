//! Names the generated client, so the crate is really built.
fn main() {
    let _ = std::any::type_name::<
        k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    >();
}
