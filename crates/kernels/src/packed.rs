//! A matrix product for constant weights: the weights are packed once, when
//! the model loads, into panels of [`MR`] rows that the kernel streams in
//! order, so a product costs no packing of the (large) weight matrix, only of
//! the (small) input. That is what the generators' products need: tens of
//! megabytes of weights against a few dozen input columns, where packing the
//! weights on every call (as a general GEMM does) costs as much as the
//! arithmetic.
//!
//! The kernel keeps an `MR × NR` block of the output in registers and walks
//! the shared dimension once per block. It is compiled for AVX2 with FMA
//! (picked at run time when the CPU has them) and for the baseline; the
//! product of input rows also for AVX-512 (32 x 12 or 48 x 8 tiles), which
//! doubles it on Intel Xeons with two 512-bit FMA units (an earlier AVX-512
//! build was measured no faster on AMD Zen 4, which runs AVX-512 as two
//! 256-bit halves). Every kernel gives the same bits.

/// Rows of a weight panel (two AVX2 vectors).
const MR: usize = 16;
/// Input columns per register block (six broadcasts: the row-input kernel
/// walks six rows by name).
const NR: usize = 6;
const _: () = assert!(NR == 6);
/// Columns per block of the input [`PackedWeights::matmul_packed`] takes.
pub const INPUT_BLOCK: usize = NR;
/// Floats of packed input kept hot while the weight panels pass.
const CACHE_FLOATS: usize = 32 * 1024;
/// Floats of gathered input kept hot while the weight panels pass.
const GATHER_FLOATS: usize = 64 * 1024;

/// Floats of input all the columns of a product may take for the weights
/// to stream past them once (8 MiB: the last-level cache's share of a
/// core or two).
const ALL_COLUMNS_FLOATS: usize = 2 << 20;

/// Whether a product takes its weight panels one at a time past every
/// column (the weights outweigh the input, which stays in the last-level
/// cache), rather than groups of columns past every panel (the weights
/// would otherwise be read from memory once per group: measured, a
/// 5120-deep dense layer of 1280 features on 256 tokens ran at 26 instead
/// of 54 G multiply-adds a second).
fn streams_weights(rows: usize, depth: usize, n: usize) -> bool {
    rows >= n && n * depth <= ALL_COLUMNS_FLOATS
}

/// How many input columns of a product of this depth the kernel keeps in
/// cache at once (a group): callers that gather their input (a
/// convolution's taps) hand it chunks of this many.
pub fn columns_per_call(depth: usize) -> usize {
    (CACHE_FLOATS / (depth.max(1) * NR)).max(1) * NR
}

/// `A` (`rows × depth`), packed for [`PackedWeights::matmul`].
#[derive(Debug)]
pub struct PackedWeights {
    /// `panels × depth × MR`: panel `p` holds rows `p·MR ..` column by column.
    data: Vec<f32>,
    rows: usize,
    depth: usize,
}

impl PackedWeights {
    /// Packs `A = Wᵀ` where `w` is `depth × rows`, row-major (a transposed
    /// convolution's weight viewed as input channels × kernel taps).
    pub fn from_transposed(w: &[f32], depth: usize, rows: usize) -> Self {
        assert_eq!(w.len(), depth * rows, "weights have the wrong size");
        let panels = rows.div_ceil(MR);
        let mut data = vec![0.0f32; panels * depth * MR];
        for p in 0..panels {
            for k in 0..depth {
                for r in 0..MR {
                    let row = p * MR + r;
                    if row < rows {
                        data[(p * depth + k) * MR + r] = w[k * rows + row];
                    }
                }
            }
        }
        Self { data, rows, depth }
    }

    /// Packs `A` given row-major (`rows × depth`: a dense layer's weight,
    /// output features by input features).
    pub fn from_rows(a: &[f32], rows: usize, depth: usize) -> Self {
        assert_eq!(a.len(), rows * depth, "weights have the wrong size");
        let mut t = vec![0.0f32; rows * depth];
        for r in 0..rows {
            for k in 0..depth {
                t[k * rows + r] = a[r * depth + k];
            }
        }
        Self::from_transposed(&t, depth, rows)
    }

    /// `out = (A × x[:, cols])ᵀ`: `x` is `depth × stride`, row-major, of
    /// which the columns `cols` are used; `out` is `cols.len() × rows`,
    /// row-major (each input column's results side by side, which the
    /// kernel writes a cache line at a time).
    pub fn matmul(&self, x: &[f32], stride: usize, cols: std::ops::Range<usize>, out: &mut [f32]) {
        assert_eq!(x.len(), self.depth * stride, "input has the wrong size");
        assert!(cols.end <= stride, "columns out of range");
        let n = cols.len();
        assert_eq!(out.len(), self.rows * n, "output has the wrong size");
        let blocks = n.div_ceil(NR);
        let mut xp = vec![0.0f32; blocks * self.depth * NR];
        for b in 0..blocks {
            for k in 0..self.depth {
                let start = b * NR;
                let len = NR.min(n - start);
                let src = &x[k * stride + cols.start + start..][..len];
                xp[(b * self.depth + k) * NR..][..len].copy_from_slice(src);
            }
        }
        Self::run::<false, false>(&self.data, self.depth, self.rows, &xp, n, out, 0);
    }

    /// Rows of `A` (columns of each output row).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of `A` (rows of the input).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// [`PackedWeights::matmul`] of input the caller has already packed, so
    /// that it can be gathered straight into this layout (a convolution's
    /// input taps): `xp` is `n.div_ceil(INPUT_BLOCK)` blocks of `depth ×
    /// INPUT_BLOCK`, block `b`, row `k`, lane `q` holding `x[k][b·INPUT_BLOCK
    /// + q]` (lanes past `n` are ignored); `out` is `n × rows`, row-major.
    pub fn matmul_packed(&self, xp: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(
            xp.len(),
            n.div_ceil(NR) * self.depth * NR,
            "packed input has the wrong size"
        );
        assert_eq!(out.len(), self.rows * n, "output has the wrong size");
        Self::run::<false, false>(&self.data, self.depth, self.rows, xp, n, out, 0);
    }

    /// `out = (A × xᵀ)ᵀ` for `x` given as `n` rows of `depth` (row-major,
    /// each column of the product contiguous): the input needs no packing,
    /// the kernel broadcasts from six rows at a time. `out` is `n × rows`,
    /// row-major.
    pub fn matmul_rows(&self, x: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.depth, "input rows have the wrong size");
        assert_eq!(out.len(), self.rows * n, "output has the wrong size");
        Self::run::<false, true>(&self.data, self.depth, self.rows, x, n, out, 0);
    }

    /// [`PackedWeights::matmul_rows`] for the rows of `A` that the panels
    /// `panels` hold only (a product split between threads by its output
    /// features): `out` is `n × panel_rows(panels).len()`, row-major.
    pub fn matmul_rows_of(&self, panels: std::ops::Range<usize>, x: &[f32], n: usize, out: &mut [f32]) {
        assert!(panels.end <= self.panels(), "panels out of range");
        assert_eq!(x.len(), n * self.depth, "input rows have the wrong size");
        let rows = self.panel_rows(panels.clone()).len();
        assert_eq!(out.len(), rows * n, "output has the wrong size");
        let data = &self.data[panels.start * self.depth * MR..panels.end * self.depth * MR];
        Self::run::<false, true>(data, self.depth, rows, x, n, out, 0);
    }

    /// The product with columns gathered from anywhere in `x`, with no
    /// packing: column `j` is the `runs` starting at `x[columns.inputs[j]]`
    /// (together `depth` floats) and its `rows` results, after `epilogue`,
    /// go to `out[columns.outputs[j] ..]`. A convolution over a padded,
    /// channels-innermost map reads its windows this way in place.
    pub fn matmul_gathered(
        &self,
        x: &[f32],
        runs: Runs,
        columns: Columns<'_>,
        out: &mut [f32],
        epilogue: Epilogue<'_>,
    ) {
        assert_eq!(runs.count * runs.len, self.depth, "runs do not add up to the depth");
        assert_eq!(columns.inputs.len(), columns.outputs.len(), "columns without an output");
        if let Epilogue::BiasRelu(bias) = epilogue {
            assert_eq!(bias.len(), self.rows, "bias has the wrong size");
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, which is all `gathered_fma`
            // is compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                gathered_fma(&self.data, self.depth, self.rows, x, runs, columns, out, epilogue);
            }
            return;
        }
        gathered::<false>(&self.data, self.depth, self.rows, x, runs, columns, out, epilogue);
    }

    /// How many panels (of 16 rows each) the weights are packed in; a
    /// product can be split between threads by panels.
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(MR)
    }

    /// The rows of `A` that the panels `panels` hold.
    pub fn panel_rows(&self, panels: std::ops::Range<usize>) -> std::ops::Range<usize> {
        (panels.start * MR).min(self.rows)..(panels.end * MR).min(self.rows)
    }

    /// [`PackedWeights::matmul_packed`] written the other way round, as `A ×
    /// x`, for the rows of the panels `panels` only: row
    /// `panel_rows(panels).start + r` of the product goes to
    /// `out[r·stride ..][..n]` (a channel-major map whose planes are `stride`
    /// apart, of which these `n` columns are written and the rest left
    /// alone).
    pub fn matmul_packed_rows_of(
        &self,
        panels: std::ops::Range<usize>,
        xp: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        assert_eq!(
            xp.len(),
            n.div_ceil(NR) * self.depth * NR,
            "packed input has the wrong size"
        );
        assert!(panels.end <= self.panels(), "panels out of range");
        let rows = self.panel_rows(panels.clone()).len();
        assert!(n <= stride, "columns overlap the next row");
        assert!(rows == 0 || out.len() >= (rows - 1) * stride + n, "output is too short");
        let data = &self.data[panels.start * self.depth * MR..panels.end * self.depth * MR];
        Self::run::<true, false>(data, self.depth, rows, xp, n, out, stride);
    }

    /// The product of input packed in blocks or (`X_ROWS`) given as rows,
    /// on the best kernel the CPU runs; by row (`A × x`, rows `stride`
    /// apart) or by column (`(A × x)ᵀ`).
    #[allow(clippy::too_many_arguments)]
    fn run<const BY_ROW: bool, const X_ROWS: bool>(
        data: &[f32],
        depth: usize,
        rows: usize,
        xp: &[f32],
        n: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if X_ROWS && !BY_ROW && depth > 0 && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, which is all `rows_avx512` is
            // compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                rows_avx512(data, xp, depth, rows, n, out);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, which is all `kernel_fma`
            // is compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                kernel_fma::<BY_ROW, X_ROWS>(data, xp, depth, rows, n, out, stride);
            }
            return;
        }
        kernel::<false, BY_ROW, X_ROWS>(data, xp, depth, rows, n, out, stride);
    }
}

/// How each column of a gathered product reads its input: its depth is
/// `count` runs of `len` contiguous floats, run `s` starting `s · stride`
/// floats after the column's offset (a window of a channels-innermost map:
/// one run per row of the window).
#[derive(Debug, Clone, Copy)]
pub struct Runs {
    pub count: usize,
    pub len: usize,
    pub stride: usize,
}

/// Where the columns of a gathered product start in its input and where
/// their results go in its output (`rows` contiguous floats each).
#[derive(Debug, Clone, Copy)]
pub struct Columns<'a> {
    pub inputs: &'a [usize],
    pub outputs: &'a [usize],
}

/// What a gathered product does to each result before storing it.
#[derive(Debug, Clone, Copy)]
pub enum Epilogue<'a> {
    /// Stores the sums.
    Plain,
    /// `max(sum + bias[row], 0)`.
    BiasRelu(&'a [f32]),
}

/// Rows `x[i]` (`n × depth`, row-major) laid out as the kernel's input
/// blocks for [`PackedWeights::matmul_packed`]: block `b`, row `k`, lane
/// `q` holds `x[b·INPUT_BLOCK + q][k]`.
pub fn pack_rows(x: &[f32], n: usize, depth: usize, xp: &mut Vec<f32>) {
    let blocks = n.div_ceil(NR);
    xp.clear();
    xp.resize(blocks * depth * NR, 0.0);
    for i in 0..n {
        let (b, q) = (i / NR, i % NR);
        let row = &x[i * depth..(i + 1) * depth];
        let block = &mut xp[b * depth * NR..(b + 1) * depth * NR];
        for (k, v) in row.iter().enumerate() {
            block[k * NR + q] = *v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn kernel_fma<const BY_ROW: bool, const X_ROWS: bool>(
    a: &[f32],
    xp: &[f32],
    depth: usize,
    rows: usize,
    n: usize,
    out: &mut [f32],
    stride: usize,
) {
    kernel::<true, BY_ROW, X_ROWS>(a, xp, depth, rows, n, out, stride);
}

#[inline(always)]
fn kernel<const FUSED: bool, const BY_ROW: bool, const X_ROWS: bool>(
    a: &[f32],
    xp: &[f32],
    depth: usize,
    rows: usize,
    n: usize,
    out: &mut [f32],
    stride: usize,
) {
    if depth == 0 {
        if BY_ROW {
            for r in 0..rows {
                out[r * stride..][..n].fill(0.0);
            }
        } else {
            out.fill(0.0);
        }
        return;
    }
    let (a_panels, _) = a.as_chunks::<MR>();
    let (x_blocks, _) = xp.as_chunks::<NR>();
    // Column blocks are taken in groups of about 128 KiB of input, which stay
    // in the core's cache while every weight panel passes over them; but
    // when the weights outweigh the input of all the columns (a dense
    // layer of thousands of features on a few hundred tokens), each panel
    // stays in cache while every column passes: the weights stream once.
    let group = if streams_weights(rows, depth, n) {
        n.div_ceil(NR)
    } else {
        (CACHE_FLOATS / (depth * NR)).max(1)
    };
    let blocks: Vec<&[[f32; NR]]> = if X_ROWS {
        Vec::new()
    } else {
        x_blocks.chunks_exact(depth).collect()
    };
    let count = n.div_ceil(NR);
    for g in 0..count.div_ceil(group) {
        let first = g * group;
        for (p, panel) in a_panels.chunks_exact(depth).enumerate() {
            for b in first..count.min(first + group) {
                let mut acc = [[0.0f32; MR]; NR];
                let mut step = |w: &[f32; MR], xs: [f32; NR]| step::<FUSED>(&mut acc, w, xs);
                if X_ROWS {
                    // Six rows (the last repeated past `n`), walked together.
                    let row = |q: usize| &xp[(b * NR + q).min(n - 1) * depth..][..depth];
                    let (r0, r1, r2, r3, r4, r5) = (row(0), row(1), row(2), row(3), row(4), row(5));
                    let lanes = r0.iter().zip(r1).zip(r2).zip(r3).zip(r4).zip(r5);
                    for (w, (((((x0, x1), x2), x3), x4), x5)) in panel.iter().zip(lanes) {
                        step(w, [*x0, *x1, *x2, *x3, *x4, *x5]);
                    }
                } else {
                    for (w, xs) in panel.iter().zip(blocks[b].iter()) {
                        step(w, *xs);
                    }
                }
                for (q, column) in acc.iter().enumerate() {
                    let j = b * NR + q;
                    if j >= n {
                        break;
                    }
                    let start = p * MR;
                    let len = MR.min(rows - start);
                    if BY_ROW {
                        for (r, v) in column[..len].iter().enumerate() {
                            out[(start + r) * stride + j] = *v;
                        }
                    } else {
                        out[j * rows + start..][..len].copy_from_slice(&column[..len]);
                    }
                }
            }
        }
    }
}

/// Floats of input rows [`rows_avx512`] keeps in the core's (second level)
/// cache while the weight panels pass over them.
const L2_FLOATS: usize = 192 * 1024;

/// [`PackedWeights::matmul_rows`] on AVX-512, with a register block of
/// weight panels (one 16-float vector each) by input rows that fits the
/// input: three panels by eight rows (24 of the 32 vector registers, three
/// weight loads and eight broadcasts a step) where that wastes fewer rows
/// of the last block than two panels by twelve (a sentence of eight
/// tokens), otherwise the latter. Each sum is the same chain of fused
/// multiply-adds from zero, in the same order, as the AVX2 kernel's, so all
/// give the same bits. On an Intel Xeon (Emerald Rapids) one thread runs
/// about twice the AVX2 kernel's multiply-adds a second
/// (`bench/results/2026-11-29-embeddings.md`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn rows_avx512(a: &[f32], x: &[f32], depth: usize, rows: usize, n: usize, out: &mut [f32]) {
    let waste = |r: usize| n.div_ceil(r) * r - n;
    if waste(8) < waste(12) {
        tile_avx512::<3, 8>(a, x, depth, rows, n, out);
    } else {
        tile_avx512::<2, 12>(a, x, depth, rows, n, out);
    }
}

/// [`rows_avx512`] with `P` panels by `R` rows a block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn tile_avx512<const P: usize, const R: usize>(
    a: &[f32],
    x: &[f32],
    depth: usize,
    rows: usize,
    n: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    };
    assert!(depth > 0, "a product of no depth has no kernel");
    assert!(a.len() >= rows.div_ceil(MR) * depth * MR, "weights are too short");
    assert!(
        x.len() >= n * depth && out.len() >= n * rows,
        "input or output is too short"
    );
    if n == 0 || rows == 0 {
        return;
    }
    let panels = rows.div_ceil(MR);
    let blocks = n.div_ceil(R);
    // Blocks of rows are taken in groups whose input stays in the core's
    // cache while every group of panels passes over it; when the weights
    // outweigh all the input, the weights stream once instead.
    let group = if streams_weights(rows, depth, n) {
        blocks
    } else {
        (L2_FLOATS / (depth * R)).max(1)
    };
    let store = |v: __m512, j: usize, start: usize, out: &mut [f32]| {
        let len = MR.min(rows - start);
        let dst = &mut out[j * rows + start..][..len];
        // SAFETY: the mask writes `len` floats, which `dst` holds.
        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), ((1u32 << len) - 1) as u16, v) };
    };
    for first in (0..blocks).step_by(group) {
        for p in (0..panels).step_by(P) {
            // The panels of the block; past the last one, the last again,
            // its copies not stored.
            let w: [*const f32; P] =
                std::array::from_fn(|i| a[(p + i).min(panels - 1) * depth * MR..][..depth * MR].as_ptr());
            for b in first..blocks.min(first + group) {
                // `R` rows (the last repeated past `n`).
                let r: [*const f32; R] = std::array::from_fn(|i| x[(b * R + i).min(n - 1) * depth..][..depth].as_ptr());
                let mut c = [[_mm512_setzero_ps(); R]; P];
                for k in 0..depth {
                    // SAFETY: `k < depth`: each panel holds `depth` steps of
                    // sixteen floats and each row `depth` floats.
                    unsafe {
                        let ws: [__m512; P] = std::array::from_fn(|i| _mm512_loadu_ps(w[i].add(k * MR)));
                        for i in 0..R {
                            let v = _mm512_set1_ps(*r[i].add(k));
                            for (c, w) in c.iter_mut().zip(&ws) {
                                c[i] = _mm512_fmadd_ps(*w, v, c[i]);
                            }
                        }
                    }
                }
                for (i, panel) in c.iter().enumerate() {
                    if p + i >= panels {
                        break;
                    }
                    for (q, v) in panel.iter().enumerate() {
                        let j = b * R + q;
                        if j >= n {
                            break;
                        }
                        store(*v, j, (p + i) * MR, out);
                    }
                }
            }
        }
    }
}

/// One step of the register block: `acc[q] += w · xs[q]` for the six
/// columns.
#[inline(always)]
fn step<const FUSED: bool>(acc: &mut [[f32; MR]; NR], w: &[f32; MR], xs: [f32; NR]) {
    for q in 0..NR {
        let x = xs[q];
        for r in 0..MR {
            acc[q][r] = if FUSED {
                w[r].mul_add(x, acc[q][r])
            } else {
                acc[q][r] + w[r] * x
            };
        }
    }
}

/// The register block walked over six input rows (as far as `w` goes),
/// written with the AVX2 intrinsics: twelve accumulators, two weight loads
/// and six broadcasts a step. (Left to the compiler, this loop nest inside
/// the run loop was vectorised across the rows, at a twentieth of the
/// speed.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn walk_rows_fma(acc: &mut [[f32; MR]; NR], w: &[[f32; MR]], x: [&[f32]; NR], next: Option<&[[f32; MR]]>) {
    use std::arch::x86_64::{
        __m256, _MM_HINT_T1, _mm_prefetch, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps,
    };
    let halves = |v: &[f32; MR]| {
        // SAFETY: `v` holds sixteen floats, read as two vectors of eight.
        unsafe { [_mm256_loadu_ps(v.as_ptr()), _mm256_loadu_ps(v.as_ptr().add(8))] }
    };
    let mut c: [[__m256; 2]; NR] = [
        halves(&acc[0]),
        halves(&acc[1]),
        halves(&acc[2]),
        halves(&acc[3]),
        halves(&acc[4]),
        halves(&acc[5]),
    ];
    let [r0, r1, r2, r3, r4, r5] = x;
    let lanes = r0.iter().zip(r1).zip(r2).zip(r3).zip(r4).zip(r5);
    let mut step = |w: &[f32; MR], xs: [&f32; NR]| {
        let [a0, a1] = halves(w);
        for (c, x) in c.iter_mut().zip(xs) {
            let b = _mm256_set1_ps(*x);
            c[0] = _mm256_fmadd_ps(a0, b, c[0]);
            c[1] = _mm256_fmadd_ps(a1, b, c[1]);
        }
    };
    match next {
        // Each step asks for the same line of the next panel, into L2, so
        // that streaming weights from memory overlaps the arithmetic.
        Some(next) => {
            for ((w, ahead), (((((x0, x1), x2), x3), x4), x5)) in w.iter().zip(next).zip(lanes) {
                _mm_prefetch::<_MM_HINT_T1>(ahead.as_ptr().cast());
                step(w, [x0, x1, x2, x3, x4, x5]);
            }
        }
        None => {
            for (w, (((((x0, x1), x2), x3), x4), x5)) in w.iter().zip(lanes) {
                step(w, [x0, x1, x2, x3, x4, x5]);
            }
        }
    }
    for (column, [lo, hi]) in acc.iter_mut().zip(c) {
        // SAFETY: `column` holds sixteen floats, written as two vectors.
        unsafe {
            _mm256_storeu_ps(column.as_mut_ptr(), lo);
            _mm256_storeu_ps(column.as_mut_ptr().add(8), hi);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
fn gathered_fma(
    a: &[f32],
    depth: usize,
    rows: usize,
    x: &[f32],
    runs: Runs,
    columns: Columns<'_>,
    out: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    gathered::<true>(a, depth, rows, x, runs, columns, out, epilogue);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gathered<const FUSED: bool>(
    a: &[f32],
    depth: usize,
    rows: usize,
    x: &[f32],
    runs: Runs,
    columns: Columns<'_>,
    out: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    let n = columns.inputs.len();
    if n == 0 || rows == 0 {
        return;
    }
    let (a_panels, _) = a.as_chunks::<MR>();
    let count = n.div_ceil(NR);
    // Blocks of columns are taken in groups whose input stays in the core's
    // cache while every weight panel passes over it; but when the weights
    // outweigh the input of all the columns (the first layers of a
    // generator: megabytes of weights, a few dozen pixels), they are
    // streamed once, each panel meeting every column.
    let group = if streams_weights(rows, depth, n) {
        count
    } else {
        (GATHER_FLOATS / (depth.max(1) * NR)).max(1)
    };
    for first in (0..count).step_by(group) {
        let panels = rows.div_ceil(MR);
        for p in 0..panels {
            let panel = &a_panels[p * depth..(p + 1) * depth];
            // Streaming the weights (one group), the next panel is fetched
            // while this one works.
            let next = (group == count && p + 1 < panels).then(|| &a_panels[(p + 1) * depth..(p + 2) * depth]);
            let start = p * MR;
            let len = MR.min(rows - start);
            for b in first..count.min(first + group) {
                let mut acc = [[0.0f32; MR]; NR];
                // Six columns (the last repeated past `n`), walked together
                // run by run.
                let column = |q: usize| columns.inputs[(b * NR + q).min(n - 1)];
                let c = [column(0), column(1), column(2), column(3), column(4), column(5)];
                for s in 0..runs.count {
                    let w = &panel[s * runs.len..(s + 1) * runs.len];
                    let row = |q: usize| &x[c[q] + s * runs.stride..][..runs.len];
                    let rows = [row(0), row(1), row(2), row(3), row(4), row(5)];
                    #[cfg(target_arch = "x86_64")]
                    if FUSED {
                        // SAFETY: `gathered::<true>` runs only inside
                        // `gathered_fma`, on a CPU with AVX2 and FMA.
                        #[allow(unsafe_code)]
                        unsafe {
                            let ahead = next.map(|next| &next[s * runs.len..(s + 1) * runs.len]);
                            walk_rows_fma(&mut acc, w, rows, ahead);
                        }
                        continue;
                    }
                    let [r0, r1, r2, r3, r4, r5] = rows;
                    let lanes = r0.iter().zip(r1).zip(r2).zip(r3).zip(r4).zip(r5);
                    for (w, (((((x0, x1), x2), x3), x4), x5)) in w.iter().zip(lanes) {
                        step::<FUSED>(&mut acc, w, [*x0, *x1, *x2, *x3, *x4, *x5]);
                    }
                }
                for (q, column) in acc.iter().enumerate() {
                    let Some(&at) = columns.outputs.get(b * NR + q) else {
                        break;
                    };
                    let dst = &mut out[at + start..][..len];
                    match epilogue {
                        Epilogue::Plain => dst.copy_from_slice(&column[..len]),
                        Epilogue::BiasRelu(bias) => {
                            for ((d, v), add) in dst.iter_mut().zip(column).zip(&bias[start..]) {
                                *d = (v + add).max(0.0);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (depth, rows, columns): ragged blocks and panels, deep and wide
    /// products (several groups of column blocks).
    const SIZES: [(usize, usize, usize); 7] = [
        (1, 1, 1),
        (3, 17, 7),
        (20, 33, 13),
        (5, 16, 6),
        (2, 40, 1),
        (600, 35, 20),
        (257, 16, 130),
    ];

    #[test]
    fn matches_the_schoolbook_product_at_ragged_sizes() {
        for (depth, rows, n) in SIZES {
            let w: Vec<f32> = (0..depth * rows).map(|i| ((i * 7 % 19) as f32 - 9.0) / 4.0).collect();
            let x: Vec<f32> = (0..depth * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let packed = PackedWeights::from_transposed(&w, depth, rows);
            let mut out = vec![f32::NAN; rows * n];
            packed.matmul(&x, n, 0..n, &mut out);
            for r in 0..rows {
                for j in 0..n {
                    let want: f32 = (0..depth).map(|k| w[k * rows + r] * x[k * n + j]).sum();
                    let got = out[j * rows + r];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "({depth},{rows},{n}) [{r},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn prepacked_input_gives_the_same_product_either_way_round() {
        // (2048, 20, 120) and (2048, 20, 100): deep enough that the AVX-512
        // kernel takes its blocks of rows in more than one group (two panels
        // by twelve rows, then three by eight).
        for (depth, rows, n) in SIZES.into_iter().chain([(0, 3, 4), (2048, 20, 120), (2048, 20, 100)]) {
            let w: Vec<f32> = (0..depth * rows).map(|i| ((i * 7 % 19) as f32 - 9.0) / 4.0).collect();
            let x: Vec<f32> = (0..depth * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let packed = PackedWeights::from_transposed(&w, depth, rows);
            assert_eq!((packed.rows(), packed.depth()), (rows, depth));
            let mut want = vec![f32::NAN; rows * n];
            packed.matmul(&x, n, 0..n, &mut want);
            let mut xp = vec![f32::NAN; n.div_ceil(INPUT_BLOCK) * depth * INPUT_BLOCK];
            for j in 0..n {
                for k in 0..depth {
                    xp[((j / INPUT_BLOCK) * depth + k) * INPUT_BLOCK + j % INPUT_BLOCK] = x[k * n + j];
                }
            }
            let mut by_column = vec![f32::NAN; rows * n];
            packed.matmul_packed(&xp, n, &mut by_column);
            assert_eq!(by_column, want);
            // The input as rows, unpacked (the last block's missing rows
            // repeat the last one): the same sums in the same order.
            let x_rows: Vec<f32> = (0..n * depth).map(|i| x[(i % depth) * n + i / depth]).collect();
            let mut from_rows = vec![f32::NAN; rows * n];
            packed.matmul_rows(&x_rows, n, &mut from_rows);
            assert_eq!(from_rows, want, "({depth},{rows},{n}) from rows");
            // The rows of the panels after the first, from input rows.
            if packed.panels() > 1 {
                let rows_of = packed.panel_rows(1..packed.panels());
                let mut part = vec![f32::NAN; rows_of.len() * n];
                packed.matmul_rows_of(1..packed.panels(), &x_rows, n, &mut part);
                for (i, r) in rows_of.clone().enumerate() {
                    for j in 0..n {
                        assert_eq!(
                            part[j * rows_of.len() + i],
                            want[j * rows + r],
                            "rows of 1..: [{r},{j}]"
                        );
                    }
                }
            }
            // By row, into the middle of wider rows: the rest stays as it was.
            let stride = n + 3;
            let mut by_row = vec![-7.0f32; rows * stride];
            packed.matmul_packed_rows_of(0..packed.panels(), &xp, n, &mut by_row[1..], stride);
            for r in 0..rows {
                for c in 0..stride {
                    let got = by_row[r * stride + c];
                    match c.checked_sub(1).filter(|j| *j < n) {
                        Some(j) => assert_eq!(got, want[j * rows + r], "[{r},{j}]"),
                        None => assert_eq!(got, -7.0, "[{r}] column {c} was written"),
                    }
                }
            }
            // The panels after the first alone: their rows only.
            if packed.panels() > 1 {
                let rows_of = packed.panel_rows(1..packed.panels());
                let mut part = vec![f32::NAN; rows_of.len() * n];
                packed.matmul_packed_rows_of(1..packed.panels(), &xp, n, &mut part, n);
                for (i, r) in rows_of.enumerate() {
                    for j in 0..n {
                        assert_eq!(part[i * n + j], want[j * rows + r], "panels 1..: [{r},{j}]");
                    }
                }
            }
        }
    }

    #[test]
    fn gathered_columns_read_their_runs_and_land_where_told() {
        // A map of 7 "pixels" of `len` floats a row, columns reading two runs
        // each (a pixel and the one `stride` floats on), in any order,
        // overlapping, some twice; outputs scattered with gaps between. More
        // rows than columns streams the weights (33 rows: with the next panel
        // prefetched); (600, 5, 80) takes groups of columns past the panels,
        // several groups.
        for (len, rows, n) in [
            (3, 5, 1),
            (4, 16, 7),
            (10, 33, 13),
            (1, 40, 6),
            (37, 20, 20),
            (600, 5, 80),
        ] {
            let runs = Runs {
                count: 2,
                len,
                stride: 2 * len,
            };
            let depth = 2 * len;
            let x: Vec<f32> = (0..40 * len).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let w: Vec<f32> = (0..rows * depth).map(|i| ((i * 7 % 19) as f32 - 9.0) / 4.0).collect();
            let packed = PackedWeights::from_rows(&w, rows, depth);
            let inputs: Vec<usize> = (0..n).map(|j| ((j * 5) % 9) * len).collect();
            let outputs: Vec<usize> = (0..n).map(|j| (n - 1 - j) * (rows + 2) + 1).collect();
            let bias: Vec<f32> = (0..rows).map(|r| r as f32 / 7.0 - 1.0).collect();
            for relu in [false, true] {
                let mut out = vec![-9.0f32; n * (rows + 2) + 1];
                let columns = Columns {
                    inputs: &inputs,
                    outputs: &outputs,
                };
                let epilogue = if relu {
                    Epilogue::BiasRelu(&bias)
                } else {
                    Epilogue::Plain
                };
                packed.matmul_gathered(&x, runs, columns, &mut out, epilogue);
                let mut written = vec![false; out.len()];
                for j in 0..n {
                    for r in 0..rows {
                        let column = |k: usize| x[inputs[j] + (k / len) * runs.stride + k % len];
                        let sum: f32 = (0..depth).map(|k| w[r * depth + k] * column(k)).sum();
                        let want = if relu { (sum + bias[r]).max(0.0) } else { sum };
                        let got = out[outputs[j] + r];
                        assert!(
                            (got - want).abs() < 1e-4,
                            "({len},{rows},{n}) relu {relu} [{r},{j}]: {got} vs {want}"
                        );
                        written[outputs[j] + r] = true;
                    }
                }
                for (i, v) in out.iter().enumerate() {
                    assert!(
                        written[i] || *v == -9.0,
                        "({len},{rows},{n}) wrote outside the columns at {i}"
                    );
                }
            }
        }
    }
}
