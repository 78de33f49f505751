//! Storing files as they arrive from a worker.

use object_store::path::Path as ObjectPath;
use object_store::{Attribute, Attributes, PutMultipartOptions, PutOptions, PutPayload, WriteMultipart};

use crate::{Files, StoredFile, now_ms, object_key};

/// Files up to this size are stored with one `put`; larger ones as a
/// multipart upload in parts of this size (S3 needs at least 5 MiB per part).
const PART_BYTES: usize = 8 << 20;
/// Parts uploaded concurrently per file.
const PARTS_IN_FLIGHT: usize = 2;

pub(crate) struct Sink {
    pub(crate) files: Files,
}

#[gantry_dispatch::async_trait]
impl gantry_dispatch::FileSink for Sink {
    async fn begin(
        &self,
        job_id: &str,
        attempt: u32,
        file_id: u32,
        media_type: &str,
    ) -> Result<Box<dyn gantry_dispatch::FileUpload>, String> {
        let key = object_key(job_id, attempt, file_id, media_type);
        Ok(Box::new(Upload {
            files: self.files.clone(),
            path: ObjectPath::from(key.as_str()),
            key,
            media_type: media_type.to_owned(),
            buffer: Vec::new(),
            multipart: None,
            size: 0,
        }))
    }

    fn limits(&self) -> gantry_dispatch::FileLimits {
        self.files.inner.limits
    }

    async fn discard(&self, files: Vec<StoredFile>) {
        let keys: Vec<String> = files.into_iter().map(|f| f.key).collect();
        if let Err(error) = self.files.delete(&keys).await {
            tracing::warn!(%error, "deleting discarded files failed; the sweeper will");
        }
    }
}

struct Upload {
    files: Files,
    path: ObjectPath,
    key: String,
    media_type: String,
    buffer: Vec<u8>,
    multipart: Option<WriteMultipart>,
    size: u64,
}

impl Upload {
    fn attributes(&self) -> Attributes {
        // The local backend keeps no attributes (its URLs carry the signed
        // media type); S3 serves the object with its Content-Type.
        if self.files.is_s3() {
            Attributes::from_iter([(Attribute::ContentType, self.media_type.clone())])
        } else {
            Attributes::new()
        }
    }
}

#[gantry_dispatch::async_trait]
impl gantry_dispatch::FileUpload for Upload {
    async fn write(&mut self, data: Vec<u8>) -> Result<(), String> {
        self.size += data.len() as u64;
        if let Some(multipart) = &mut self.multipart {
            multipart
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| e.to_string())?;
            multipart.write(&data);
            return Ok(());
        }
        self.buffer.extend_from_slice(&data);
        if self.buffer.len() >= PART_BYTES {
            let options = PutMultipartOptions {
                attributes: self.attributes(),
                ..PutMultipartOptions::default()
            };
            let upload = self
                .files
                .store()
                .put_multipart_opts(&self.path, options)
                .await
                .map_err(|e| e.to_string())?;
            let mut multipart = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            multipart.write(&std::mem::take(&mut self.buffer));
            self.multipart = Some(multipart);
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<StoredFile, String> {
        match self.multipart.take() {
            Some(multipart) => {
                multipart.finish().await.map_err(|e| e.to_string())?;
            }
            None => {
                let options = PutOptions {
                    attributes: self.attributes(),
                    ..PutOptions::default()
                };
                let payload = PutPayload::from(std::mem::take(&mut self.buffer));
                self.files
                    .store()
                    .put_opts(&self.path, payload, options)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(StoredFile {
            pointer: String::new(),
            key: self.key,
            media_type: self.media_type,
            size: self.size,
            created_ms: now_ms(),
        })
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(multipart) = self.multipart.take()
            && let Err(error) = multipart.abort().await
        {
            tracing::warn!(key = %self.key, %error, "aborting an upload failed");
        }
    }
}
