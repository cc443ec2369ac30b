//! Requests the project's client deliberately cannot make (block blobs, arbitrary
//! bytes), signed with the library's Shared Key code, for tests of refusals.

use blobdrive::azure::auth::shared_key as sign;
use blobdrive::azure::{Account, Credential};

/// Uploads `body` as a block blob named `container/name`.
pub async fn put_block_blob(account: &Account, container: &str, name: &str, body: Vec<u8>) {
    let mut url = account.blob_endpoint.clone();
    url.path_segments_mut()
        .unwrap()
        .pop_if_empty()
        .push(container)
        .push(name);
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let headers = vec![
        ("content-length".to_string(), body.len().to_string()),
        ("x-ms-blob-type".to_string(), "BlockBlob".to_string()),
        ("x-ms-date".to_string(), date),
        ("x-ms-version".to_string(), "2021-12-02".to_string()),
    ];
    let Credential::SharedKey { key } = &account.credential else {
        panic!("needs a key")
    };
    let sts = sign::string_to_sign("PUT", &url, &headers, &account.name);
    let auth = sign::authorization(&account.name, key, &sts);
    let mut req = reqwest::Client::new().put(url).body(body);
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let resp = req.header("authorization", auth).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
}
