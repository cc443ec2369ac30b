//! A copy's encryption: a volume made from a snapshot or cloned from a volume
//! has its source's bytes, so it is encrypted as its source is (a copy of a
//! LUKS2 drive is a LUKS2 drive, opened by the same passphrase), whatever the
//! StorageClass asks. A class that asks otherwise cannot be given what it
//! asks: the driver does not encrypt a plain copy (its data would have to move
//! past a header) nor decrypt an encrypted one. Such a CreateVolume is
//! INVALID_ARGUMENT, as the CSI spec has a source incompatible with the
//! request answered, and nothing is made: the volume's context (which tells
//! NodeStage to ask for the passphrase) is then always what its bytes are.

use tonic::Status;

use super::proto::CreateVolumeRequest;
use super::status_of;
use super::volume::{self, ENCRYPTION};
use crate::azure::BlobClient;
use crate::luks::LuksError;

/// Refuses a copy of `source` (a drive whose disk is `disk_size` bytes, named
/// `named` in what is said) that `req` asks to be encrypted otherwise than
/// the source is; for an encrypted source, the provisioner secret's
/// passphrase must open it, as the class's node-stage secret will have to.
pub async fn check(
    source: &BlobClient,
    disk_size: u64,
    named: &str,
    req: &CreateVolumeRequest,
) -> Result<(), Status> {
    let asks = volume::encrypted(req.parameters.get(ENCRYPTION))?;
    let is = crate::encrypted::is_luks(source, disk_size)
        .await
        .map_err(status_of)?;
    match (is, asks) {
        (false, false) => Ok(()),
        (true, false) => Err(Status::invalid_argument(format!(
            "{named} is an encrypted drive (LUKS2) and the StorageClass asks for a plain one (no {ENCRYPTION}: luks2); a copy has its source's bytes, so it is encrypted as its source is: make it with a class of {ENCRYPTION}: luks2 whose secrets hold the source's passphrase"
        ))),
        (false, true) => Err(Status::invalid_argument(format!(
            "{named} is a plain drive and the StorageClass asks for an encrypted one ({ENCRYPTION}: luks2); a copy has its source's bytes, and the driver does not encrypt them: make it with a class without {ENCRYPTION}, or copy the data into a new encrypted volume"
        ))),
        (true, true) => opens(source, disk_size, named, req).await,
    }
}

/// Whether the provisioner secret's passphrase opens the encrypted `source`.
async fn opens(
    source: &BlobClient,
    disk_size: u64,
    named: &str,
    req: &CreateVolumeRequest,
) -> Result<(), Status> {
    let passphrase = volume::passphrase_in(&req.secrets, "provisioner")?;
    match crate::encrypted::open(source, passphrase.as_bytes(), disk_size).await {
        Ok(_) => Ok(()),
        Err(LuksError::WrongPassphrase) => Err(Status::invalid_argument(format!(
            "the provisioner secret's passphrase does not open {named}: a copy of an encrypted drive opens with its source's passphrase, so the class's secrets must hold it"
        ))),
        Err(e) => Err(Status::failed_precondition(format!(
            "{named} cannot be opened: {e}"
        ))),
    }
}
