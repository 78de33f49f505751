//! Images out: 8-bit RGB pixels encoded as PNG, JPEG or lossless WebP, and
//! the `output_format` of a job's input that picks one.
use std::io::Cursor;

use image::ImageEncoder;
use serde_json::Value;

/// Encoding of the delivered images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Webp,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Jpeg => "jpeg",
            Format::Webp => "webp",
        }
    }

    /// The `output_format` of a job's input: PNG when absent; `None`, with
    /// the reason in `errors`, when it names no format.
    pub fn from_input(value: Option<&Value>, errors: &mut Vec<String>) -> Option<Format> {
        match value {
            None | Some(Value::Null) => Some(Format::Png),
            Some(Value::String(f)) => match f.to_ascii_lowercase().as_str() {
                "png" => Some(Format::Png),
                "jpeg" | "jpg" => Some(Format::Jpeg),
                "webp" => Some(Format::Webp),
                _ => {
                    errors.push(format!("output_format: one of png, jpeg, webp (got {f:?})"));
                    None
                }
            },
            Some(_) => {
                errors.push("output_format: one of png, jpeg, webp".into());
                None
            }
        }
    }

    pub fn media_type(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::Webp => "image/webp",
        }
    }
}

/// JPEG quality of `output_format: "jpeg"`.
pub const JPEG_QUALITY: u8 = 90;

/// Encodes 8-bit RGB pixels (row-major, `width × height × 3` bytes) as PNG,
/// JPEG (quality 90) or lossless WebP.
pub fn encode_rgb(pixels: &[u8], w: u32, h: u32, format: Format) -> Result<Vec<u8>, String> {
    let mut out = Cursor::new(Vec::new());
    let color = image::ExtendedColorType::Rgb8;
    let written = match format {
        Format::Png => image::codecs::png::PngEncoder::new(&mut out).write_image(pixels, w, h, color),
        Format::Jpeg => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY).write_image(pixels, w, h, color)
        }
        Format::Webp => image::codecs::webp::WebPEncoder::new_lossless(&mut out).write_image(pixels, w, h, color),
    };
    written.map_err(|e| format!("cannot encode the image as {}: {e}", format.name()))?;
    Ok(out.into_inner())
}
