//! Images out: 8-bit RGB pixels encoded as PNG, JPEG or lossless WebP, and
//! the `output_format` of a job's input that picks one (`Format` reads
//! itself from a job's input and states its schema).
use std::io::Cursor;

use image::ImageEncoder;

/// Encoding of the delivered images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Webp,
}

/// The names `output_format` takes, in the order the schema lists them.
const NAMES: [&str; 3] = ["png", "jpeg", "webp"];

/// The `output_format` of a job's input: a name in any case, `jpg` for
/// `jpeg`, as the image models have always read it.
impl<'de> serde::Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        match name.to_ascii_lowercase().as_str() {
            "png" => Ok(Format::Png),
            "jpeg" | "jpg" => Ok(Format::Jpeg),
            "webp" => Ok(Format::Webp),
            _ => Err(serde::de::Error::custom(format!(
                "must be one of {} (got '{name}')",
                NAMES.join(", ")
            ))),
        }
    }
}

impl utoipa::PartialSchema for Format {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(NAMES))
            .into()
    }
}

impl utoipa::ToSchema for Format {}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Jpeg => "jpeg",
            Format::Webp => "webp",
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
