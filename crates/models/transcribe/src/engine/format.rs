//! The CTranslate2 `model.bin` container (version 6): a spec name, a list of
//! named tensors, and aliases between names. Every tensor is widened to `f32`
//! as it is read.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::EngineError;

/// One variable of the file, widened to `f32`.
#[derive(Debug)]
pub(crate) struct Tensor {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

/// The variables of a `model.bin`, by name (aliases resolved).
#[derive(Debug)]
pub(crate) struct ModelFile {
    path: PathBuf,
    pub spec: String,
    pub revision: u32,
    vars: HashMap<String, Tensor>,
    aliases: HashMap<String, String>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: impl std::fmt::Display) -> EngineError {
        EngineError::Format {
            path: self.path.to_path_buf(),
            message: format!("{what} (at byte {})", self.at),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], EngineError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            None => Err(self.bad(format!("the file ends early: {n} more bytes wanted"))),
        }
    }

    fn u8(&mut self) -> Result<u8, EngineError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, EngineError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, EngineError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String, EngineError> {
        let n = self.u16()? as usize;
        let raw = self.take(n)?;
        let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
        String::from_utf8(raw.to_vec()).map_err(|_| self.bad("a name is not UTF-8"))
    }
}

impl ModelFile {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        let bytes = super::read_file(path)?;
        Self::parse(&bytes, path)
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<Self, EngineError> {
        let mut r = Reader { bytes, at: 0, path };
        let version = r.u32()?;
        if version != 6 {
            return Err(r.bad(format!("model.bin version {version}; only version 6 is read")));
        }
        let spec = r.string()?;
        let revision = r.u32()?;
        let count = r.u32()? as usize;
        let mut vars = HashMap::with_capacity(count);
        for _ in 0..count {
            let name = r.string()?;
            let rank = r.u8()? as usize;
            let mut dims = Vec::with_capacity(rank);
            for _ in 0..rank {
                dims.push(r.u32()? as usize);
            }
            let dtype = r.u8()?;
            let nbytes = r.u32()? as usize;
            let elems: usize = dims.iter().product();
            let width = match dtype {
                0 | 3 => 4,
                1 => 1,
                2 | 4 | 5 => 2,
                other => return Err(r.bad(format!("{name}: unknown data type {other}"))),
            };
            if elems * width != nbytes {
                return Err(r.bad(format!(
                    "{name}: {nbytes} bytes for shape {dims:?} of {width}-byte values"
                )));
            }
            let raw = r.take(nbytes)?;
            let data: Vec<f32> = match dtype {
                0 => raw
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                1 => raw.iter().map(|b| f32::from(*b as i8)).collect(),
                2 => raw
                    .chunks_exact(2)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])))
                    .collect(),
                3 => raw
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
                    .collect(),
                4 => raw
                    .chunks_exact(2)
                    .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                    .collect(),
                _ => raw
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                    .collect(),
            };
            vars.insert(name, Tensor { dims, data });
        }
        let mut aliases = HashMap::new();
        if r.at < bytes.len() {
            let n = r.u32()?;
            for _ in 0..n {
                let alias = r.string()?;
                let target = r.string()?;
                aliases.insert(alias, target);
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            spec,
            revision,
            vars,
            aliases,
        })
    }

    fn resolve<'s>(&'s self, name: &'s str) -> &'s str {
        self.aliases.get(name).map_or(name, String::as_str)
    }

    /// Takes the tensor `name` out of the file, checking its shape.
    pub fn take(&mut self, name: &str, dims: &[usize]) -> Result<Vec<f32>, EngineError> {
        let key = self.resolve(name).to_string();
        let found = self.vars.remove(&key);
        let tensor = found.ok_or_else(|| EngineError::Format {
            path: self.path.clone(),
            message: format!("the variable {name} is missing"),
        })?;
        if tensor.dims != dims {
            return Err(EngineError::Shape {
                name: name.to_string(),
                expected: dims.to_vec(),
                got: tensor.dims,
            });
        }
        Ok(tensor.data)
    }

    /// A scalar attribute, if the file has it.
    pub fn scalar(&self, name: &str) -> Option<f32> {
        let t = self.vars.get(self.resolve(name))?;
        (t.data.len() == 1).then(|| t.data[0])
    }

    /// Whether the file has the variable `name`.
    pub fn has(&self, name: &str) -> bool {
        self.vars.contains_key(self.resolve(name))
    }

    /// The shape of the variable `name`, if the file has it.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.vars.get(self.resolve(name)).map(|t| t.dims.as_slice())
    }

    /// Whether `name` is an alias of `target`.
    pub fn is_alias(&self, name: &str, target: &str) -> bool {
        self.aliases.get(name).is_some_and(|t| t == target)
    }
}
