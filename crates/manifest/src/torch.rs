//! Reads PyTorch checkpoints (`torch.save` files) without Python, and writes
//! their tensors as safetensors.
//!
//! Two on-disk forms exist: the zip archive of PyTorch 1.6 and later (a
//! `data.pkl` plus one `data/<key>` member per storage) and the older "legacy"
//! stream (a magic number, the protocol version, system information, the
//! pickled object, the list of storage keys, then each storage's bytes). Both
//! describe the object with a pickle whose tensors refer to storages through
//! persistent ids.
//!
//! The unpickler here understands the opcodes such files use and resolves only
//! three globals: `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`
//! and the typed storage classes (`torch.FloatStorage`, ...). Anything else is
//! refused, so loading a checkpoint never runs code, unlike `pickle.load`.
//! Nested dictionaries are flattened with dots: the `main.0.weight` of a
//! checkpoint's `netG_state_dict` becomes `netG_state_dict.main.0.weight`.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{0}")]
    Format(String),
}

fn format_err(message: impl Into<String>) -> TorchError {
    TorchError::Format(message.into())
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The dtype's name in a safetensors header.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        Some(match name {
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F32" => DType::F32,
            "F64" => DType::F64,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I16" => DType::I16,
            "I8" => DType::I8,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }

    fn from_storage_class(name: &str) -> Option<DType> {
        Some(match name {
            "HalfStorage" => DType::F16,
            "BFloat16Storage" => DType::BF16,
            "FloatStorage" => DType::F32,
            "DoubleStorage" => DType::F64,
            "LongStorage" => DType::I64,
            "IntStorage" => DType::I32,
            "ShortStorage" => DType::I16,
            "CharStorage" => DType::I8,
            "ByteStorage" => DType::U8,
            "BoolStorage" => DType::Bool,
            _ => return None,
        })
    }
}

/// A tensor's element type, shape and little-endian bytes (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements as `f32` (converting from any floating type), or `None`
    /// for integer tensors.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        let bytes = &self.data;
        Some(match self.dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F64 => bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(bytes_of::<8>(b)) as f32)
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            _ => return None,
        })
    }
}

/// The first `N` bytes of `slice`, which the caller has checked holds them.
fn bytes_of<const N: usize>(slice: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&slice[..N]);
    out
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut f = frac;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// Every tensor of the checkpoint at `path`, by flattened name.
pub fn load(path: &Path) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let io_err = |source| TorchError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(io_err)?;
    drop(file);
    if &magic == b"PK\x03\x04" {
        load_zip(path)
    } else {
        let bytes = std::fs::read(path).map_err(io_err)?;
        load_legacy(&bytes)
    }
}

fn load_zip(path: &Path) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let file = File::open(path).map_err(|source| TorchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| format_err(format!("not a PyTorch zip: {e}")))?;
    let pickle_name = archive
        .file_names()
        .filter_map(Result::ok)
        .find(|name| name.ends_with("/data.pkl") || name == "data.pkl")
        .map(|name| name.into_owned())
        .ok_or_else(|| format_err("the archive has no data.pkl"))?;
    let prefix = pickle_name.trim_end_matches("data.pkl").to_owned();
    let mut pickle = Vec::new();
    archive
        .by_name(&pickle_name)
        .and_then(|mut entry| entry.read_to_end(&mut pickle).map_err(Into::into))
        .map_err(|e| format_err(format!("cannot read {pickle_name}: {e}")))?;
    let (object, _) = Unpickler::new(&pickle).run()?;
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut tensors = BTreeMap::new();
    for (name, tensor) in flatten(object)? {
        if !storages.contains_key(&tensor.key) {
            let member = format!("{prefix}data/{}", tensor.key);
            let mut bytes = Vec::new();
            archive
                .by_name(&member)
                .and_then(|mut entry| entry.read_to_end(&mut bytes).map_err(Into::into))
                .map_err(|e| format_err(format!("cannot read {member}: {e}")))?;
            storages.insert(tensor.key.clone(), bytes);
        }
        tensors.insert(name, tensor.materialize(&storages[&tensor.key])?);
    }
    Ok(tensors)
}

/// The magic number that opens a legacy `torch.save` stream.
const LEGACY_MAGIC: u128 = 0x1950a86a20f9469cfc6c;

fn load_legacy(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let mut at = 0;
    let mut next = |what: &str| -> Result<Value, TorchError> {
        let (value, used) = Unpickler::new(&bytes[at..])
            .run()
            .map_err(|e| format_err(format!("{what}: {e}")))?;
        at += used;
        Ok(value)
    };
    match next("magic number")? {
        Value::Int(n) if n as u128 == LEGACY_MAGIC => {}
        _ => {
            return Err(format_err(
                "not a PyTorch checkpoint (neither a zip archive nor the legacy format)",
            ));
        }
    }
    next("protocol version")?;
    next("system information")?;
    let object = next("object")?;
    let keys = match next("storage keys")? {
        Value::List(keys) => keys
            .into_iter()
            .map(|k| match k {
                Value::Str(s) => Ok(s),
                other => Err(format_err(format!("storage key is not a string: {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => return Err(format_err(format!("storage keys are not a list: {other:?}"))),
    };
    let entries = flatten(object)?;
    let dtypes: HashMap<&str, DType> = entries.iter().map(|(_, t)| (t.key.as_str(), t.dtype)).collect();
    let mut storages = HashMap::new();
    let mut rest = &bytes[at..];
    for key in &keys {
        let dtype = *dtypes
            .get(key.as_str())
            .ok_or_else(|| format_err(format!("storage {key} belongs to no tensor")))?;
        if rest.len() < 8 {
            return Err(format_err("the file ends inside the storages"));
        }
        let count = u64::from_le_bytes(bytes_of::<8>(&rest[..8])) as usize;
        let len = count
            .checked_mul(dtype.size())
            .filter(|len| 8 + len <= rest.len())
            .ok_or_else(|| format_err(format!("storage {key} runs past the end of the file")))?;
        storages.insert(key.clone(), rest[8..8 + len].to_vec());
        rest = &rest[8 + len..];
    }
    entries
        .into_iter()
        .map(|(name, tensor)| {
            let storage = storages
                .get(&tensor.key)
                .ok_or_else(|| format_err(format!("storage {} of {name} is missing", tensor.key)))?;
            Ok((name, tensor.materialize(storage)?))
        })
        .collect()
}

/// A tensor as the pickle describes it: a view of a storage.
#[derive(Debug, Clone, PartialEq)]
struct TensorRef {
    key: String,
    dtype: DType,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

impl TensorRef {
    /// Copies the view's elements, row-major, out of its storage.
    fn materialize(&self, storage: &[u8]) -> Result<Tensor, TorchError> {
        let size = self.dtype.size();
        let numel: usize = self.shape.iter().product();
        let mut data = Vec::with_capacity(numel * size);
        let last = self
            .shape
            .iter()
            .zip(&self.stride)
            .map(|(n, s)| n.saturating_sub(1) * s)
            .sum::<usize>()
            + self.offset;
        if numel > 0 && (last + 1) * size > storage.len() {
            return Err(format_err(format!(
                "tensor in storage {} reaches past its {} bytes",
                self.key,
                storage.len()
            )));
        }
        let mut index = vec![0usize; self.shape.len()];
        for _ in 0..numel {
            let element: usize = self.offset + index.iter().zip(&self.stride).map(|(i, s)| i * s).sum::<usize>();
            data.extend_from_slice(&storage[element * size..(element + 1) * size]);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data,
        })
    }
}

/// The tensors of a (possibly nested) dictionary, by dotted name.
fn flatten(object: Value) -> Result<Vec<(String, TensorRef)>, TorchError> {
    fn walk(prefix: &str, value: Value, out: &mut Vec<(String, TensorRef)>) -> Result<(), TorchError> {
        match value {
            Value::Dict(items) => {
                for (key, value) in items {
                    let key = match key {
                        Value::Str(s) => s,
                        Value::Int(n) => n.to_string(),
                        other => return Err(format_err(format!("dictionary key {other:?} is not a name"))),
                    };
                    let name = if prefix.is_empty() {
                        key
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&name, value, out)?;
                }
                Ok(())
            }
            Value::Tensor(tensor) => {
                out.push((prefix.to_owned(), tensor));
                Ok(())
            }
            // Numbers, strings and the like (an epoch counter, hyperparameters) hold no weights.
            _ => Ok(()),
        }
    }
    let mut out = Vec::new();
    walk("", object, &mut out)?;
    if out.is_empty() {
        return Err(format_err("the checkpoint holds no tensors"));
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(String, String),
    /// A storage's persistent id, resolved: (key, dtype).
    Storage(String, DType),
    Tensor(TensorRef),
    Mark,
}

struct Unpickler<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
}

impl<'a> Unpickler<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            at: 0,
            stack: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TorchError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| format_err("the pickle ends early"))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, TorchError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, TorchError> {
        Ok(u16::from_le_bytes(bytes_of::<2>(self.take(2)?)))
    }

    fn u32(&mut self) -> Result<u32, TorchError> {
        Ok(u32::from_le_bytes(bytes_of::<4>(self.take(4)?)))
    }

    fn u64(&mut self) -> Result<u64, TorchError> {
        Ok(u64::from_le_bytes(bytes_of::<8>(self.take(8)?)))
    }

    fn line(&mut self) -> Result<String, TorchError> {
        let rest = &self.bytes[self.at..];
        let end = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| format_err("the pickle ends inside a line"))?;
        let line = String::from_utf8_lossy(&rest[..end]).into_owned();
        self.at += end + 1;
        Ok(line)
    }

    fn string(&mut self, len: usize) -> Result<Value, TorchError> {
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec())
            .map(Value::Str)
            .map_err(|_| format_err("a pickled string is not UTF-8"))
    }

    fn pop(&mut self) -> Result<Value, TorchError> {
        self.stack
            .pop()
            .ok_or_else(|| format_err("the pickle's stack underflows"))
    }

    fn top(&mut self) -> Result<&mut Value, TorchError> {
        self.stack
            .last_mut()
            .ok_or_else(|| format_err("the pickle's stack is empty"))
    }

    /// The values above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, TorchError> {
        let mark = self
            .stack
            .iter()
            .rposition(|v| matches!(v, Value::Mark))
            .ok_or_else(|| format_err("the pickle has no mark"))?;
        let items = self.stack.split_off(mark + 1);
        self.stack.pop();
        Ok(items)
    }

    /// Runs the pickle up to its STOP; the object and the bytes consumed.
    fn run(mut self) -> Result<(Value, usize), TorchError> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO
                }
                0x95 => {
                    self.u64()?; // FRAME
                }
                b'.' => {
                    let value = self.pop()?;
                    return Ok((value, self.at));
                }
                b'(' => self.stack.push(Value::Mark),
                b'}' => self.stack.push(Value::Dict(Vec::new())),
                b']' => self.stack.push(Value::List(Vec::new())),
                b')' => self.stack.push(Value::Tuple(Vec::new())),
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let n = self.u32()? as i32;
                    self.stack.push(Value::Int(n.into()));
                }
                b'K' => {
                    let n = self.u8()?;
                    self.stack.push(Value::Int(n.into()));
                }
                b'M' => {
                    let n = self.u16()?;
                    self.stack.push(Value::Int(n.into()));
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    if n > 16 {
                        return Err(format_err("a pickled integer is too long"));
                    }
                    let bytes = self.take(n)?;
                    let mut value: i128 = 0;
                    for (i, b) in bytes.iter().enumerate() {
                        value |= i128::from(*b) << (8 * i);
                    }
                    if n > 0 && n < 16 && bytes[n - 1] & 0x80 != 0 {
                        value -= 1i128 << (8 * n);
                    }
                    self.stack.push(Value::Int(value));
                }
                b'G' => {
                    let bits = u64::from_be_bytes(bytes_of::<8>(self.take(8)?));
                    self.stack.push(Value::Float(f64::from_bits(bits)));
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let s = self.string(n)?;
                    self.stack.push(s);
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    let s = self.string(n)?;
                    self.stack.push(s);
                }
                0x8d => {
                    let n = usize::try_from(self.u64()?).map_err(|_| format_err("string too long"))?;
                    let s = self.string(n)?;
                    self.stack.push(s);
                }
                b'T' | b'U' => {
                    let n = if op == b'T' {
                        self.u32()? as usize
                    } else {
                        usize::from(self.u8()?)
                    };
                    let bytes = self.take(n)?;
                    // Python 2 strings: bytes taken as Latin-1.
                    self.stack
                        .push(Value::Str(bytes.iter().map(|b| char::from(*b)).collect()));
                }
                b'B' | b'C' => {
                    let n = if op == b'B' {
                        self.u32()? as usize
                    } else {
                        usize::from(self.u8()?)
                    };
                    let bytes = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(bytes));
                }
                b'q' => {
                    let i = u32::from(self.u8()?);
                    let v = self.top()?.clone();
                    self.memo.insert(i, v);
                }
                b'r' => {
                    let i = self.u32()?;
                    let v = self.top()?.clone();
                    self.memo.insert(i, v);
                }
                0x94 => {
                    let i = u32::try_from(self.memo.len()).map_err(|_| format_err("memo too large"))?;
                    let v = self.top()?.clone();
                    self.memo.insert(i, v);
                }
                b'h' | b'j' => {
                    let i = if op == b'h' { u32::from(self.u8()?) } else { self.u32()? };
                    let v = self
                        .memo
                        .get(&i)
                        .cloned()
                        .ok_or_else(|| format_err(format!("the pickle reads memo {i} before writing it")))?;
                    self.stack.push(v);
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.stack.push(Value::Global(module, name));
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(module), Value::Str(name)) => self.stack.push(Value::Global(module, name)),
                        _ => return Err(format_err("STACK_GLOBAL of something other than names")),
                    }
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n {
                        return Err(format_err("the pickle's stack underflows"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(items));
                }
                b'a' => {
                    let item = self.pop()?;
                    match self.top()? {
                        Value::List(items) => items.push(item),
                        _ => return Err(format_err("APPEND to something other than a list")),
                    }
                }
                b'e' => {
                    let new = self.pop_mark()?;
                    match self.top()? {
                        Value::List(items) => items.extend(new),
                        _ => return Err(format_err("APPENDS to something other than a list")),
                    }
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    match self.top()? {
                        Value::Dict(items) => items.push((key, value)),
                        _ => return Err(format_err("SETITEM on something other than a dictionary")),
                    }
                }
                b'u' => {
                    let new = self.pop_mark()?;
                    if new.len() % 2 != 0 {
                        return Err(format_err("SETITEMS with an odd number of values"));
                    }
                    match self.top()? {
                        Value::Dict(items) => {
                            let mut it = new.into_iter();
                            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                                items.push((k, v));
                            }
                        }
                        _ => return Err(format_err("SETITEMS on something other than a dictionary")),
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = storage_of(pid)?;
                    self.stack.push(storage);
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let value = reduce(callable, args)?;
                    self.stack.push(value);
                }
                b'b' => {
                    // BUILD: the state of an OrderedDict (its `_metadata`) is not needed.
                    self.pop()?;
                }
                other => return Err(format_err(format!("unsupported pickle opcode 0x{other:02x}"))),
            }
        }
    }
}

/// A persistent id `('storage', <storage class>, key, location, size)`.
fn storage_of(pid: Value) -> Result<Value, TorchError> {
    let Value::Tuple(items) = pid else {
        return Err(format_err("a persistent id is not a tuple"));
    };
    match items.as_slice() {
        [Value::Str(kind), Value::Global(module, class), Value::Str(key), ..]
            if kind == "storage" && module == "torch" =>
        {
            let dtype = DType::from_storage_class(class)
                .ok_or_else(|| format_err(format!("unsupported storage torch.{class}")))?;
            Ok(Value::Storage(key.clone(), dtype))
        }
        _ => Err(format_err(format!("unsupported persistent id {items:?}"))),
    }
}

fn reduce(callable: Value, args: Value) -> Result<Value, TorchError> {
    let Value::Global(module, name) = &callable else {
        return Err(format_err(format!("cannot call {callable:?}")));
    };
    let Value::Tuple(args) = args else {
        return Err(format_err("call arguments are not a tuple"));
    };
    match (module.as_str(), name.as_str()) {
        ("collections", "OrderedDict") => Ok(Value::Dict(Vec::new())),
        ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor") => {
            let [
                Value::Storage(key, dtype),
                Value::Int(offset),
                Value::Tuple(shape),
                Value::Tuple(stride),
                ..,
            ] = args.as_slice()
            else {
                return Err(format_err(format!("unexpected arguments to {module}.{name}: {args:?}")));
            };
            let dims = |items: &[Value]| -> Result<Vec<usize>, TorchError> {
                items
                    .iter()
                    .map(|v| match v {
                        Value::Int(n) => usize::try_from(*n).map_err(|_| format_err("negative tensor dimension")),
                        _ => Err(format_err("a tensor dimension is not an integer")),
                    })
                    .collect()
            };
            let shape = dims(shape)?;
            let stride = dims(stride)?;
            if shape.len() != stride.len() {
                return Err(format_err("a tensor's shape and stride differ in length"));
            }
            Ok(Value::Tensor(TensorRef {
                key: key.clone(),
                dtype: *dtype,
                offset: usize::try_from(*offset).map_err(|_| format_err("negative storage offset"))?,
                shape,
                stride,
            }))
        }
        _ => Err(format_err(format!(
            "the checkpoint calls {module}.{name}, which a weights file has no need of; refusing it"
        ))),
    }
}

/// Writes `tensors` as a safetensors file (header: JSON of dtype, shape and
/// byte offsets per tensor, names sorted; then the data).
pub fn write_safetensors(tensors: &BTreeMap<String, Tensor>, path: &Path) -> io::Result<()> {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, tensor) in tensors {
        let end = offset + tensor.data.len();
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": tensor.dtype.safetensors_name(),
                "shape": tensor.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(io::Error::other)?;
    // The data starts 8-byte aligned.
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut out = io::BufWriter::new(File::create(path)?);
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    for tensor in tensors.values() {
        out.write_all(&tensor.data)?;
    }
    out.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()
}

/// Reads every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let bytes = std::fs::read(path).map_err(|source| TorchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    if bytes.len() < 8 {
        return Err(format_err("a safetensors file is at least 8 bytes"));
    }
    let header_len = u64::from_le_bytes(bytes_of::<8>(&bytes[..8])) as usize;
    let data_start = 8usize
        .checked_add(header_len)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| format_err("the safetensors header runs past the end of the file"))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| format_err(format!("bad safetensors header: {e}")))?;
    let data = &bytes[data_start..];
    let mut tensors = BTreeMap::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"]
            .as_str()
            .and_then(DType::from_safetensors_name)
            .ok_or_else(|| format_err(format!("{name}: unknown dtype")))?;
        let shape: Vec<usize> =
            serde_json::from_value(info["shape"].clone()).map_err(|_| format_err(format!("{name}: bad shape")))?;
        let [start, end]: [usize; 2] = serde_json::from_value(info["data_offsets"].clone())
            .map_err(|_| format_err(format!("{name}: bad data_offsets")))?;
        let expected = shape.iter().product::<usize>() * dtype.size();
        if start > end || end > data.len() || end - start != expected {
            return Err(format_err(format!("{name}: data_offsets do not match its shape")));
        }
        tensors.insert(
            name,
            Tensor {
                dtype,
                shape,
                data: data[start..end].to_vec(),
            },
        );
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pickle written by hand the way `torch.save` writes a state dict:
    /// an OrderedDict of one 2x3 float tensor, plus a non-tensor entry.
    fn state_dict_pickle() -> Vec<u8> {
        let mut p = vec![0x80, 2, b'c'];
        p.extend_from_slice(b"collections\nOrderedDict\n");
        p.extend_from_slice(&[b'q', 0, b')', b'R', b'q', 1, b'(']);
        p.push(b'X');
        p.extend_from_slice(&(8u32).to_le_bytes());
        p.extend_from_slice(b"w.weight");
        p.push(b'c');
        p.extend_from_slice(b"torch._utils\n_rebuild_tensor_v2\n");
        p.extend_from_slice(b"((");
        p.push(b'X');
        p.extend_from_slice(&(7u32).to_le_bytes());
        p.extend_from_slice(b"storage");
        p.push(b'c');
        p.extend_from_slice(b"torch\nFloatStorage\n");
        p.push(b'X');
        p.extend_from_slice(&(1u32).to_le_bytes());
        p.extend_from_slice(b"0");
        p.push(b'X');
        p.extend_from_slice(&(3u32).to_le_bytes());
        p.extend_from_slice(b"cpu");
        p.extend_from_slice(&[b'K', 6, b't', b'Q']);
        // offset 0, shape (3, 2) stored transposed: stride (1, 3)
        p.extend_from_slice(&[b'K', 0, b'K', 3, b'K', 2, 0x86, b'K', 1, b'K', 3, 0x86, 0x89]);
        p.extend_from_slice(b"c");
        p.extend_from_slice(b"collections\nOrderedDict\n");
        p.extend_from_slice(b")RtR");
        p.push(b'X');
        p.extend_from_slice(&(5u32).to_le_bytes());
        p.extend_from_slice(b"epoch");
        p.extend_from_slice(&[b'K', 7, b'u', b'.']);
        p
    }

    #[test]
    fn a_strided_tensor_is_materialized_row_major() {
        let (object, used) = Unpickler::new(&state_dict_pickle()).run().unwrap();
        assert_eq!(used, state_dict_pickle().len());
        let entries = flatten(object).unwrap();
        assert_eq!(entries.len(), 1);
        let (name, tensor) = &entries[0];
        assert_eq!(name, "w.weight");
        let storage: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let t = tensor.materialize(&storage).unwrap();
        assert_eq!(t.shape, vec![3, 2]);
        // element (r, c) = storage[r + 3c]
        assert_eq!(t.to_f32().unwrap(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn a_legacy_stream_round_trips_through_safetensors() {
        let mut file = Vec::new();
        // magic number as LONG1, protocol 1001, sys info {}
        file.extend_from_slice(&[0x80, 2, 0x8a, 10]);
        file.extend_from_slice(&LEGACY_MAGIC.to_le_bytes()[..10]);
        file.push(b'.');
        file.extend_from_slice(&[0x80, 2, b'M', 0xe9, 0x03, b'.']);
        file.extend_from_slice(&[0x80, 2, b'}', b'.']);
        file.extend_from_slice(&state_dict_pickle());
        file.extend_from_slice(&[0x80, 2, b']', b'(', b'X', 1, 0, 0, 0, b'0', b'e', b'.']);
        file.extend_from_slice(&6u64.to_le_bytes());
        for i in 0..6 {
            file.extend_from_slice(&(i as f32 * 0.5).to_le_bytes());
        }
        let dir = tempfile::tempdir().unwrap();
        let pth = dir.path().join("legacy.pth");
        std::fs::write(&pth, &file).unwrap();
        let tensors = load(&pth).unwrap();
        assert_eq!(
            tensors["w.weight"].to_f32().unwrap(),
            vec![0.0, 1.5, 0.5, 2.0, 1.0, 2.5]
        );
        let st = dir.path().join("legacy.safetensors");
        write_safetensors(&tensors, &st).unwrap();
        assert_eq!(read_safetensors(&st).unwrap(), tensors);
    }

    #[test]
    fn code_in_a_checkpoint_is_refused() {
        let mut p = vec![0x80, 2, b'c'];
        p.extend_from_slice(b"os\nsystem\n");
        p.extend_from_slice(&[b'X', 4, 0, 0, 0]);
        p.extend_from_slice(b"true");
        p.extend_from_slice(&[0x85, b'R', b'.']);
        let err = Unpickler::new(&p).run().unwrap_err().to_string();
        assert!(err.contains("os.system"), "{err}");
    }

    #[test]
    fn half_floats_convert() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
    }
}
