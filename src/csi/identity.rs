//! The Identity service: the plugin's name and version, what it serves, and
//! whether it is ready.

use tonic::{Request, Response, Status};

use super::proto::identity_server::Identity;
use super::proto::plugin_capability::{self, service, volume_expansion};
use super::proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

/// The driver's name as Kubernetes knows it (a CSIDriver object's name, and the
/// `provisioner` of a StorageClass): domain-name form, at most 63 characters.
pub const PLUGIN_NAME: &str = "csi.blobdrive.io";

/// Identity, telling what the process serves: SnapshotMetadata is served
/// where Controller is (the sidecar that calls it runs beside the
/// controller's).
pub struct IdentityService {
    pub snapshot_metadata: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: PLUGIN_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = |t: service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        // A mounted drive grows in place (its daemon grows the blob, the loop
        // device and the filesystem).
        let online = PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        };
        let mut capabilities = vec![service(service::Type::ControllerService), online];
        if self.snapshot_metadata {
            capabilities.push(service(service::Type::SnapshotMetadataService));
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[cfg(test)]
mod tests {
    use super::PLUGIN_NAME;

    #[test]
    fn the_name_is_a_domain_name_of_at_most_63_characters() {
        assert!(PLUGIN_NAME.len() <= 63);
        let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        assert!(ends(PLUGIN_NAME.chars().next()) && ends(PLUGIN_NAME.chars().last()));
        assert!(PLUGIN_NAME
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    }
}
