//! H.264 in MP4: frames in, a file that browsers play out.
//!
//! Frames are planar RGB floats in `[0, 1]`. Each is converted to YUV 4:2:0
//! (BT.601, limited range, chroma averaged over 2x2 pixels, and the SPS says
//! so in its VUI), encoded by OpenH264 (Constrained Baseline, one thread,
//! so the same frames give the same bytes), and its NAL units are written as
//! one MP4 sample (length-prefixed, the SPS and PPS moved into the `avcC`
//! box). The finished file is rewritten "fast start": the `moov` box before
//! the media data, so a player can begin while the rest downloads.

use std::io::Cursor;

use bytes::Bytes;
use mp4::{AvcConfig, MediaConfig, Mp4Config, Mp4Sample, Mp4Writer, TrackConfig, TrackType};
use openh264::OpenH264API;
use openh264::encoder::{
    BitRate, Complexity, Encoder, EncoderConfig, FrameRate, IntraFramePeriod, Profile, RateControlMode, UsageType,
    VuiConfig,
};
use openh264::formats::YUVBuffer;

/// Ticks per second of the video track: 1000 per frame at any whole fps.
const TICKS_PER_FRAME: u32 = 1000;

/// An H.264 MP4 being written, frame by frame.
pub struct Mp4Encoder {
    encoder: Encoder,
    width: usize,
    height: usize,
    fps: u32,
    samples: Vec<(Vec<u8>, bool)>,
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
    yuv: Vec<u8>,
}

impl std::fmt::Debug for Mp4Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mp4Encoder")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("fps", &self.fps)
            .field("frames", &self.samples.len())
            .finish()
    }
}

impl Mp4Encoder {
    /// An encoder for `width` × `height` (both even) at `fps` frames per
    /// second, with an IDR picture every `keyframe_every` frames.
    pub fn new(width: usize, height: usize, fps: u32, keyframe_every: u32) -> Result<Self, String> {
        if width == 0 || height == 0 || !width.is_multiple_of(2) || !height.is_multiple_of(2) {
            return Err(format!(
                "a video's sides must be even and positive (got {width}x{height})"
            ));
        }
        if fps == 0 {
            return Err("a video needs at least one frame per second".into());
        }
        // About 0.15 bits per pixel per frame: crisp at these sizes.
        let bps = (width * height) as f64 * f64::from(fps) * 0.15;
        let config = EncoderConfig::new()
            .profile(Profile::Baseline)
            .usage_type(UsageType::CameraVideoRealTime)
            .rate_control_mode(RateControlMode::Quality)
            .bitrate(BitRate::from_bps(bps.clamp(100_000.0, 20_000_000.0) as u32))
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            .complexity(Complexity::High)
            .skip_frames(false)
            .intra_frame_period(IntraFramePeriod::from_num_frames(keyframe_every.max(1)))
            .num_threads(1)
            .vui(VuiConfig::bt601());
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| format!("cannot start the H.264 encoder: {e}"))?;
        Ok(Self {
            encoder,
            width,
            height,
            fps,
            samples: Vec::new(),
            sps: None,
            pps: None,
            yuv: vec![0; width * height * 3 / 2],
        })
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.samples.len()
    }

    /// Encodes the next frame: planar RGB, `3 × height × width`, in `[0, 1]`.
    pub fn push(&mut self, rgb: &[f32]) -> Result<(), String> {
        let (w, h) = (self.width, self.height);
        if rgb.len() != 3 * w * h {
            return Err(format!("a frame must hold {} floats (got {})", 3 * w * h, rgb.len()));
        }
        rgb_to_i420(rgb, w, h, &mut self.yuv);
        let source = YUVBuffer::from_vec(self.yuv.clone(), w, h);
        let stream = self
            .encoder
            .encode(&source)
            .map_err(|e| format!("the H.264 encoder failed: {e}"))?;
        let mut sample = Vec::new();
        let mut sync = false;
        for l in 0..stream.num_layers() {
            let Some(layer) = stream.layer(l) else { continue };
            for n in 0..layer.nal_count() {
                let Some(nal) = layer.nal_unit(n) else { continue };
                let body = strip_start_code(nal);
                let Some(&header) = body.first() else { continue };
                match header & 0x1f {
                    7 => self.sps = Some(body.to_vec()),
                    8 => self.pps = Some(body.to_vec()),
                    kind => {
                        sync |= kind == 5;
                        sample.extend_from_slice(&(body.len() as u32).to_be_bytes());
                        sample.extend_from_slice(body);
                    }
                }
            }
        }
        if sample.is_empty() {
            return Err("the H.264 encoder returned no picture for a frame".into());
        }
        self.samples.push((sample, sync));
        Ok(())
    }

    /// The finished MP4 file (fast start).
    pub fn finish(self) -> Result<Vec<u8>, String> {
        let (Some(sps), Some(pps)) = (self.sps, self.pps) else {
            return Err("the video has no frames".into());
        };
        let fail = |e: mp4::Error| format!("cannot write the MP4 file: {e}");
        let timescale = self.fps * TICKS_PER_FRAME;
        let config = Mp4Config {
            major_brand: "isom".parse().map_err(fail)?,
            minor_version: 512,
            compatible_brands: ["isom", "iso2", "avc1", "mp41"]
                .iter()
                .map(|b| b.parse())
                .collect::<Result<_, _>>()
                .map_err(fail)?,
            timescale: 1000,
        };
        let mut writer = Mp4Writer::write_start(Cursor::new(Vec::new()), &config).map_err(fail)?;
        writer
            .add_track(&TrackConfig {
                track_type: TrackType::Video,
                timescale,
                language: "und".into(),
                media_conf: MediaConfig::AvcConfig(AvcConfig {
                    width: self.width as u16,
                    height: self.height as u16,
                    seq_param_set: sps,
                    pic_param_set: pps,
                }),
            })
            .map_err(fail)?;
        for (i, (bytes, is_sync)) in self.samples.into_iter().enumerate() {
            let sample = Mp4Sample {
                start_time: i as u64 * u64::from(TICKS_PER_FRAME),
                duration: TICKS_PER_FRAME,
                rendering_offset: 0,
                is_sync,
                bytes: Bytes::from(bytes),
            };
            writer.write_sample(1, &sample).map_err(fail)?;
        }
        writer.write_end().map_err(fail)?;
        fast_start(writer.into_writer().into_inner())
    }
}

fn strip_start_code(nal: &[u8]) -> &[u8] {
    if let Some(rest) = nal.strip_prefix(&[0, 0, 0, 1]) {
        rest
    } else if let Some(rest) = nal.strip_prefix(&[0, 0, 1]) {
        rest
    } else {
        nal
    }
}

/// BT.601 limited-range YUV 4:2:0 (I420) from planar RGB in `[0, 1]`.
pub fn rgb_to_i420(rgb: &[f32], w: usize, h: usize, out: &mut [u8]) {
    let plane = w * h;
    let (r, rest) = rgb.split_at(plane);
    let (g, b) = rest.split_at(plane);
    let (y_plane, chroma) = out.split_at_mut(plane);
    let (u_plane, v_plane) = chroma.split_at_mut(plane / 4);
    let byte = |v: f32| v.round().clamp(0.0, 255.0) as u8;
    for i in 0..plane {
        let (rr, gg, bb) = (r[i].clamp(0.0, 1.0), g[i].clamp(0.0, 1.0), b[i].clamp(0.0, 1.0));
        y_plane[i] = byte(16.0 + 219.0 * (0.299 * rr + 0.587 * gg + 0.114 * bb));
    }
    let cw = w / 2;
    for cy in 0..h / 2 {
        for cx in 0..cw {
            let mut sum = [0.0f32; 3];
            for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let i = (2 * cy + dy) * w + 2 * cx + dx;
                sum[0] += r[i].clamp(0.0, 1.0);
                sum[1] += g[i].clamp(0.0, 1.0);
                sum[2] += b[i].clamp(0.0, 1.0);
            }
            let [rr, gg, bb] = sum.map(|s| s / 4.0);
            let cb = -0.168_736 * rr - 0.331_264 * gg + 0.5 * bb;
            let cr = 0.5 * rr - 0.418_688 * gg - 0.081_312 * bb;
            u_plane[cy * cw + cx] = byte(128.0 + 224.0 * cb);
            v_plane[cy * cw + cx] = byte(128.0 + 224.0 * cr);
        }
    }
}

/// Moves the `moov` box in front of `mdat`, adding its size to every chunk
/// offset (`stco`; `co64` is not written at these sizes but is handled).
fn fast_start(file: Vec<u8>) -> Result<Vec<u8>, String> {
    let boxes = top_level_boxes(&file)?;
    let find = |kind: &[u8; 4]| boxes.iter().find(|(k, _)| k == kind).map(|(_, r)| r.clone());
    let (Some(moov), Some(mdat)) = (find(b"moov"), find(b"mdat")) else {
        return Err("the MP4 file lacks its moov or mdat box".into());
    };
    if moov.start < mdat.start {
        return Ok(file);
    }
    let shift = (moov.end - moov.start) as u64;
    let mut header = file[moov.clone()].to_vec();
    shift_chunk_offsets(&mut header, 8, shift)?;
    let mut out = Vec::with_capacity(file.len());
    for (kind, range) in &boxes {
        if kind == b"moov" {
            continue;
        }
        if kind == b"mdat" {
            out.extend_from_slice(&header);
        }
        out.extend_from_slice(&file[range.clone()]);
    }
    Ok(out)
}

type BoxRange = std::ops::Range<usize>;

fn top_level_boxes(data: &[u8]) -> Result<Vec<([u8; 4], BoxRange)>, String> {
    children(data, 0..data.len())
}

/// The boxes inside `range` of `data`, each as its type and byte range.
fn children(data: &[u8], range: BoxRange) -> Result<Vec<([u8; 4], BoxRange)>, String> {
    let mut out = Vec::new();
    let mut at = range.start;
    while at + 8 <= range.end {
        let size32 = u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let kind = [data[at + 4], data[at + 5], data[at + 6], data[at + 7]];
        let size = match size32 {
            0 => range.end - at,
            1 => {
                if at + 16 > range.end {
                    return Err("a truncated MP4 box".into());
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&data[at + 8..at + 16]);
                usize::try_from(u64::from_be_bytes(b)).map_err(|_| "an MP4 box too large".to_string())?
            }
            n => n,
        };
        if size < 8 || at + size > range.end {
            return Err("a malformed MP4 box".into());
        }
        out.push((kind, at..at + size));
        at += size;
    }
    Ok(out)
}

/// Adds `shift` to the chunk offsets of every track in a `moov` box held in
/// `moov` (whose children start at `from`).
fn shift_chunk_offsets(moov: &mut [u8], from: usize, shift: u64) -> Result<(), String> {
    const CONTAINERS: [&[u8; 4]; 5] = [b"trak", b"mdia", b"minf", b"stbl", b"edts"];
    for (kind, range) in children(moov, from..moov.len())? {
        if CONTAINERS.contains(&&kind) {
            shift_chunk_offsets_in(moov, range.start + 8..range.end, shift)?;
        }
    }
    Ok(())
}

fn shift_chunk_offsets_in(data: &mut [u8], range: BoxRange, shift: u64) -> Result<(), String> {
    const CONTAINERS: [&[u8; 4]; 4] = [b"mdia", b"minf", b"stbl", b"edts"];
    for (kind, r) in children(data, range)? {
        if CONTAINERS.contains(&&kind) {
            shift_chunk_offsets_in(data, r.start + 8..r.end, shift)?;
        } else if &kind == b"stco" || &kind == b"co64" {
            // version+flags (4), entry count (4), then the offsets
            let count = u32::from_be_bytes([
                data[r.start + 12],
                data[r.start + 13],
                data[r.start + 14],
                data[r.start + 15],
            ]) as usize;
            let width = if &kind == b"stco" { 4 } else { 8 };
            let first = r.start + 16;
            if first + count * width > r.end {
                return Err("a truncated chunk offset table".into());
            }
            for i in 0..count {
                let at = first + i * width;
                if width == 4 {
                    let v = u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
                    let shifted = u32::try_from(u64::from(v) + shift).map_err(|_| "a chunk offset past 4 GiB")?;
                    data[at..at + 4].copy_from_slice(&shifted.to_be_bytes());
                } else {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&data[at..at + 8]);
                    data[at..at + 8].copy_from_slice(&(u64::from_be_bytes(b) + shift).to_be_bytes());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(w: usize, h: usize, k: usize) -> Vec<f32> {
        let mut rgb = vec![0.0f32; 3 * w * h];
        for y in 0..h {
            for x in 0..w {
                let i = y * w + x;
                rgb[i] = ((x + k) % w) as f32 / w as f32;
                rgb[w * h + i] = y as f32 / h as f32;
                rgb[2 * w * h + i] = 0.5;
            }
        }
        rgb
    }

    #[test]
    fn grey_is_grey_and_white_is_white() {
        let mut out = vec![0u8; 6];
        rgb_to_i420(&[0.5; 12], 2, 2, &mut out);
        assert_eq!(out, [126, 126, 126, 126, 128, 128]);
        rgb_to_i420(&[1.0; 12], 2, 2, &mut out);
        assert_eq!(out, [235, 235, 235, 235, 128, 128]);
    }

    #[test]
    fn the_file_starts_fast_and_repeats_exactly() {
        let encode = || {
            let mut enc = Mp4Encoder::new(64, 48, 12, 12).unwrap();
            for k in 0..14 {
                enc.push(&frame(64, 48, k)).unwrap();
            }
            assert_eq!(enc.frames(), 14);
            enc.finish().unwrap()
        };
        let file = encode();
        let kinds: Vec<[u8; 4]> = top_level_boxes(&file).unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds.first(), Some(b"ftyp"));
        let moov = kinds.iter().position(|k| k == b"moov").unwrap();
        let mdat = kinds.iter().position(|k| k == b"mdat").unwrap();
        assert!(moov < mdat, "{kinds:?}");
        // the mp4 crate reads it back: one track, 14 samples, 64x48, and the
        // first sample's bytes are where the shifted offset says
        let reader = mp4::Mp4Reader::read_header(Cursor::new(file.clone()), file.len() as u64).unwrap();
        let track = reader.tracks().get(&1).unwrap();
        assert_eq!((track.width(), track.height(), track.sample_count()), (64, 48, 14));
        let mut reader = reader;
        let first = reader.read_sample(1, 1).unwrap().unwrap();
        assert!(first.is_sync);
        let len = u32::from_be_bytes([first.bytes[0], first.bytes[1], first.bytes[2], first.bytes[3]]) as usize;
        assert_eq!(first.bytes[4] & 0x1f, 5, "the first picture is an IDR slice");
        assert!(len + 4 <= first.bytes.len());
        assert_eq!(file, encode(), "the same frames give the same bytes");
    }

    #[test]
    fn odd_sides_are_refused() {
        assert!(Mp4Encoder::new(63, 48, 12, 12).is_err());
        assert!(Mp4Encoder::new(64, 48, 0, 12).is_err());
    }
}
