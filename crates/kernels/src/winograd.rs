//! 3x3 convolutions of stride 1 by Winograd's minimal filtering F(m×m,
//! 3×3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural
//! Networks", 2015): each `m × m` tile of the output is computed from an
//! `a × a` tile of the input (`a = m + 2`) with `a²` multiplications per
//! pair of channels instead of `9·m²`, 2.25x fewer for `m = 2` and 4x fewer
//! for `m = 4`.
//!
//! With `U = G g Gᵀ` (the filter, transformed once at load), `V = Bᵀ d B`
//! (an input tile) and `Y = Aᵀ M A` (the output tile), the sum over input
//! channels `M[ξ] = Σ_ci U[ξ][co][ci] · V[ξ][ci]` is, for each of the `a²`
//! positions `ξ`, a matrix product of the output channels by the input
//! channels by the tiles: `a²` products on the packed kernel
//! ([`PackedWeights::matmul_rows`]), each of depth `cin`.
//!
//! The transforms are a few additions per value, done on eight channels at
//! once in vector lanes: the input is first copied, zero-padded, with its
//! channels innermost, so that the eight channels of an input value are one
//! load, the transformed tile of eight channels is 36 (or 16) stores, each
//! tile's transformed channels are a row of the product's input, and each
//! tile's output channels a row of its output. Only the final write of the
//! output tiles into the channel-major map scatters.

use std::ops::Range;

use rayon::prelude::*;

use crate::conv::{Activation, Buffers, Scratch, fit};
use crate::packed::PackedWeights;

/// The output tile side `m` of F(m×m, 3×3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tile {
    /// F(2×2, 3×3): 16 products, 2.25x fewer multiplications.
    F2,
    /// F(4×4, 3×3): 36 products, 4x fewer multiplications, slightly larger
    /// rounding errors (transform coefficients up to 8).
    F4,
}

impl Tile {
    /// Output tile side.
    pub fn m(self) -> usize {
        match self {
            Self::F2 => 2,
            Self::F4 => 4,
        }
    }

    /// Input tile side.
    fn a(self) -> usize {
        self.m() + 2
    }
}

// F(2, 3) at the points 0, 1, -1 (and infinity).
#[cfg(test)]
const BT2: [[f32; 4]; 4] = [
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 1.0, 1.0, 0.0],
    [0.0, -1.0, 1.0, 0.0],
    [0.0, 1.0, 0.0, -1.0],
];
const G2: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];
#[cfg(test)]
const AT2: [[f32; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];

// F(4, 3) at the points 0, 1, -1, 2, -2 (and infinity).
#[cfg(test)]
const BT4: [[f32; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];
const G4: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];
#[cfg(test)]
const AT4: [[f32; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// Channels transformed together, one per vector lane.
const LANES: usize = 8;

/// Eight lanes; the arithmetic compiles to one vector instruction each.
#[derive(Debug, Clone, Copy, Default)]
struct V8([f32; LANES]);

impl V8 {
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut v = [0.0; LANES];
        v.copy_from_slice(&s[..LANES]);
        Self(v)
    }

    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        s[..LANES].copy_from_slice(&self.0);
    }

    #[inline(always)]
    fn map2(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Self(std::array::from_fn(|i| f(self.0[i], o.0[i])))
    }
}

impl std::ops::Add for V8 {
    type Output = Self;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.map2(o, |a, b| a + b)
    }
}

impl std::ops::Sub for V8 {
    type Output = Self;
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.map2(o, |a, b| a - b)
    }
}

impl std::ops::Mul<f32> for V8 {
    type Output = Self;
    #[inline(always)]
    fn mul(self, k: f32) -> Self {
        Self(self.0.map(|a| a * k))
    }
}

/// One tile size's transforms, on tiles of eight channels stored row by
/// row (`A × A` input and product tiles, `M × M` output tiles).
trait Kind {
    const A: usize;
    const M: usize;
    /// `Bᵀ v` of one line of `A` values (a column or a row of a tile).
    fn input_line(d: [V8; 6]) -> [V8; 6];
    /// `Aᵀ v` of one line of `A` products, `M` values out.
    fn output_line(m: [V8; 6]) -> [V8; 4];

    /// `Bᵀ d B`, `d` and the result `A × A` row-major. (Lines are
    /// gathered with plain loops: built with `array::from_fn`, they
    /// compiled to calls that were not inlined into the AVX2 loops, at a
    /// cost measured on the VAE decoder and the generators.)
    #[inline(always)]
    fn input(d: &[V8; 36]) -> [V8; 36] {
        let a = Self::A;
        let mut t = [V8::default(); 36];
        for c in 0..a {
            let mut line = [V8::default(); 6];
            for r in 0..a {
                line[r] = d[r * a + c];
            }
            let line = Self::input_line(line);
            for r in 0..a {
                t[r * a + c] = line[r];
            }
        }
        let mut v = [V8::default(); 36];
        for r in 0..a {
            let mut line = [V8::default(); 6];
            line[..a].copy_from_slice(&t[r * a..][..a]);
            let line = Self::input_line(line);
            v[r * a..][..a].copy_from_slice(&line[..a]);
        }
        v
    }

    /// `Aᵀ m A`, `m` `A × A` and the result `M × M` row-major.
    #[inline(always)]
    fn output(m: &[V8; 36]) -> [V8; 16] {
        let (a, o) = (Self::A, Self::M);
        let mut t = [V8::default(); 36];
        for c in 0..a {
            let mut line = [V8::default(); 6];
            for r in 0..a {
                line[r] = m[r * a + c];
            }
            let line = Self::output_line(line);
            for r in 0..o {
                t[r * a + c] = line[r];
            }
        }
        let mut y = [V8::default(); 16];
        for r in 0..o {
            let mut line = [V8::default(); 6];
            line[..a].copy_from_slice(&t[r * a..][..a]);
            let line = Self::output_line(line);
            y[r * o..][..o].copy_from_slice(&line[..o]);
        }
        y
    }
}

/// F(2×2, 3×3): `BT2` and `AT2` with their common terms shared.
struct F2;

impl Kind for F2 {
    const A: usize = 4;
    const M: usize = 2;

    #[inline(always)]
    fn input_line([d0, d1, d2, d3, ..]: [V8; 6]) -> [V8; 6] {
        let z = V8::default();
        [d0 - d2, d1 + d2, d2 - d1, d1 - d3, z, z]
    }

    #[inline(always)]
    fn output_line([m0, m1, m2, m3, ..]: [V8; 6]) -> [V8; 4] {
        let z = V8::default();
        [m0 + m1 + m2, m1 - m2 - m3, z, z]
    }
}

/// F(4×4, 3×3): `BT4` and `AT4` with their common terms shared.
struct F4;

impl Kind for F4 {
    const A: usize = 6;
    const M: usize = 4;

    #[inline(always)]
    fn input_line([d0, d1, d2, d3, d4, d5]: [V8; 6]) -> [V8; 6] {
        let a = d4 - d2 * 4.0;
        let b = d3 - d1 * 4.0;
        let c = d4 - d2;
        let e = (d3 - d1) * 2.0;
        [
            d0 * 4.0 - d2 * 5.0 + d4,
            a + b,
            a - b,
            c + e,
            c - e,
            d1 * 4.0 - d3 * 5.0 + d5,
        ]
    }

    #[inline(always)]
    fn output_line([m0, m1, m2, m3, m4, m5]: [V8; 6]) -> [V8; 4] {
        let (s1, d1) = (m1 + m2, m1 - m2);
        let (s2, d2) = (m3 + m4, m3 - m4);
        [m0 + s1 + s2, d1 + d2 * 2.0, s1 + s2 * 4.0, d1 + d2 * 8.0 + m5]
    }
}

/// Floats of transformed input and products a thread keeps per chunk of
/// tiles: they are written once and read once per chunk, from the
/// last-level cache.
const CHUNK_FLOATS: usize = 1024 * 1024;
/// Bounds of the tiles per chunk (`bench/results/2026-11-27-stable-diffusion.md` has the measured
/// choices: 48 to 455 tiles changed the times by less than this machine's
/// noise, except that fewer than about 96 slowed the 512-channel layers).
const MIN_TILES: usize = 96;
const MAX_TILES: usize = 256;

/// The transformed weights of one convolution.
#[derive(Debug)]
pub(crate) struct Winograd {
    tile: Tile,
    /// `cin` rounded up to whole vectors (the extra channels are zeros).
    depth: usize,
    cout: usize,
    /// `U[ξ]`, `cout × depth`, one per position of the `a × a` tile.
    weights: Vec<PackedWeights>,
}

/// Where the tiles lie: the zero-padded input, channels innermost (`ph ×
/// pw × depth`, the image at row 1, column 1, and enough rows and columns
/// of zeros after it for whole tiles), and the output's size.
struct Grid<'a> {
    padded: &'a [f32],
    bias: &'a [f32],
    activation: &'a Activation,
    /// Tiles per row.
    tw: usize,
    pw: usize,
    depth: usize,
    h: usize,
    w: usize,
}

impl Winograd {
    /// `weight` is PyTorch's `cout × cin × 3 × 3`; `cout` a multiple of 8.
    pub(crate) fn new(weight: &[f32], cin: usize, cout: usize, tile: Tile) -> Self {
        assert_eq!(weight.len(), cout * cin * 9, "convolution weight has the wrong size");
        assert!(
            cout.is_multiple_of(LANES),
            "Winograd convolutions need output channels in multiples of {LANES}"
        );
        let g: &[[f64; 3]] = match tile {
            Tile::F2 => &G2,
            Tile::F4 => &G4,
        };
        let a = tile.a();
        let depth = cin.next_multiple_of(LANES);
        let mut u = vec![vec![0.0f32; cout * depth]; a * a];
        for (k, filter) in weight.chunks_exact(9).enumerate() {
            let (co, ci) = (k / cin, k % cin);
            let filter: [[f64; 3]; 3] = std::array::from_fn(|r| std::array::from_fn(|c| f64::from(filter[r * 3 + c])));
            for (xi, u) in u.iter_mut().enumerate() {
                u[co * depth + ci] = filter_transform(g, &filter, xi / a, xi % a);
            }
        }
        let weights = u.iter().map(|u| PackedWeights::from_rows(u, cout, depth)).collect();
        Self {
            tile,
            depth,
            cout,
            weights,
        }
    }

    /// Tiles per chunk: as many as keep a chunk's transformed input and
    /// products within [`CHUNK_FLOATS`], but at least [`MIN_TILES`] so that
    /// each weight read serves many (wide layers), and at most
    /// [`MAX_TILES`].
    fn chunk(&self) -> usize {
        let a = self.tile.a();
        (CHUNK_FLOATS / (a * a * (self.depth + self.cout))).clamp(MIN_TILES, MAX_TILES)
    }

    /// One image, `x` (`cin × h × w`) into `out` (`cout × h × w`), the
    /// bias added and the activation applied, on `parts` threads of the
    /// current rayon pool, each taking whole rows of tiles.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn image(
        &self,
        x: &[f32],
        (h, w): (usize, usize),
        out: &mut [f32],
        bias: &[f32],
        activation: &Activation,
        scratch: &mut Scratch,
        parts: usize,
    ) {
        let m = self.tile.m();
        let (th, tw) = (h.div_ceil(m), w.div_ceil(m));
        let (ph, pw) = (th * m + 2, tw * m + 2);
        let depth = self.depth;
        let padded = fit(&mut scratch.padded, ph * pw * depth);
        // Channel-major to channels innermost, a row at a time (each row
        // stays in cache while every channel is written into it), the rows
        // spread over the threads.
        let parts_rows = parts.max(1);
        let band = ph.div_ceil(parts_rows).max(1);
        let pad_rows = |(first, rows): (usize, &mut [f32])| {
            for (i, row) in rows.chunks_exact_mut(pw * depth).enumerate() {
                row.fill(0.0);
                let y = (first * band + i).wrapping_sub(1);
                if y >= h {
                    continue;
                }
                for (group, planes) in x.chunks(LANES * h * w).enumerate() {
                    let lanes = planes.len() / (h * w);
                    let dst = &mut row[depth + group * LANES..];
                    for (px, v) in dst.chunks_mut(depth).take(w).enumerate() {
                        for (l, v) in v[..lanes].iter_mut().enumerate() {
                            *v = planes[(l * h + y) * w + px];
                        }
                    }
                }
            }
        };
        if parts_rows > 1 {
            padded.par_chunks_mut(band * pw * depth).enumerate().for_each(pad_rows);
        } else {
            padded.chunks_mut(band * pw * depth).enumerate().for_each(pad_rows);
        }
        let grid = Grid {
            padded: &scratch.padded[..],
            bias,
            activation,
            tw,
            pw,
            depth,
            h,
            w,
        };
        let parts = parts.clamp(1, th.max(1));
        // Thread t takes the rows of tiles bounds[t]..bounds[t + 1], which
        // are output rows bounds[t]·m.. of every plane.
        let bounds: Vec<usize> = (0..=parts).map(|t| th * t / parts).collect();
        let mut shares: Vec<Vec<&mut [f32]>> = (0..parts).map(|_| Vec::with_capacity(self.cout)).collect();
        for plane in out.chunks_exact_mut(h * w) {
            let mut rest = plane;
            for (t, share) in shares.iter_mut().enumerate() {
                let rows = (bounds[t + 1] * m).min(h) - (bounds[t] * m).min(h);
                let (mine, tail) = rest.split_at_mut(rows * w);
                share.push(mine);
                rest = tail;
            }
        }
        let buffers = &mut scratch.buffers;
        buffers.resize_with(parts, Default::default);
        let work = |t: usize, planes: &mut [&mut [f32]], buffers: &mut Buffers| {
            let rows = bounds[t]..bounds[t + 1];
            match self.tile {
                Tile::F2 => self.rows::<F2>(&grid, rows, planes, buffers),
                Tile::F4 => self.rows::<F4>(&grid, rows, planes, buffers),
            }
        };
        if parts == 1 {
            work(0, &mut shares[0], &mut buffers[0]);
        } else {
            shares
                .par_iter_mut()
                .zip(buffers.par_iter_mut())
                .enumerate()
                .for_each(|(t, (planes, buffers))| work(t, planes, buffers));
        }
    }

    /// The rows of tiles `rows`, chunk by chunk: transform the input, one
    /// product per tile position, transform the output into `planes` (the
    /// part of each output plane these rows cover). The transforms are
    /// compiled for AVX2 (picked at run time when the CPU has it) and for
    /// the baseline.
    fn rows<K: Kind>(&self, grid: &Grid, rows: Range<usize>, planes: &mut [&mut [f32]], buffers: &mut Buffers) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, which is all `rows_avx2`
            // is compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                self.rows_avx2::<K>(grid, rows, planes, buffers);
            }
            return;
        }
        self.rows_any::<K>(grid, rows, planes, buffers);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn rows_avx2<K: Kind>(&self, grid: &Grid, rows: Range<usize>, planes: &mut [&mut [f32]], buffers: &mut Buffers) {
        self.rows_any::<K>(grid, rows, planes, buffers);
    }

    #[inline(always)]
    fn rows_any<K: Kind>(&self, grid: &Grid, rows: Range<usize>, planes: &mut [&mut [f32]], buffers: &mut Buffers) {
        let tiles = rows.len() * grid.tw;
        let chunk = self.chunk();
        let (depth, cout, a2) = (self.depth, self.cout, K::A * K::A);
        let mut first = 0;
        while first < tiles {
            let n = chunk.min(tiles - first);
            // The chunk's tiles, as (row of tiles, column of tiles).
            let at: Vec<(usize, usize)> = (first..first + n)
                .map(|t| (rows.start + t / grid.tw, t % grid.tw))
                .collect();
            let v = fit(&mut buffers.xp, a2 * n * depth);
            transform_input::<K>(grid, &at, v);
            let prod = fit(&mut buffers.prod, a2 * n * cout);
            for (k, weights) in self.weights.iter().enumerate() {
                let v = &v[k * n * depth..][..n * depth];
                weights.matmul_rows(v, n, &mut prod[k * n * cout..][..n * cout]);
            }
            let row0 = rows.start * K::M;
            transform_output::<K>(prod, grid, cout, &at, row0, planes);
            first += n;
        }
    }
}

/// `(G g Gᵀ)[i][j] = Σ_r Σ_c G[i][r] g[r][c] G[j][c]` of a 3x3 filter, in
/// f64.
fn filter_transform(gm: &[[f64; 3]], filter: &[[f64; 3]; 3], i: usize, j: usize) -> f32 {
    let mut sum = 0.0f64;
    for (r, row) in filter.iter().enumerate() {
        for (c, value) in row.iter().enumerate() {
            sum += gm[i][r] * value * gm[j][c];
        }
    }
    sum as f32
}

/// A 4x4, stride-2, padding-1 transposed convolution (a generator's
/// upsampling layer) by F(4×4, 3×3). Output pixel `(2m + a, 2n + b)` is a
/// 2x2 window of the input at `(m - 1 + a, n - 1 + b)` through four of the
/// kernel's taps, so the whole layer is one 3x3 convolution of the input
/// (padded by one) with `4 · cout` outputs per pixel, one set per parity
/// `(a, b)`, each of which uses four of the nine taps. F(4×4) computes that
/// with 36 products per 4x4 tile instead of the 64 the four parities take
/// directly (1.78x fewer multiply-adds), for 9x the weights.
///
/// Maps are `n` images of `side × side` pixels, channels innermost, with a
/// border of one zero pixel (`n × (side + 2) × (side + 2) × channels`).
#[derive(Debug)]
pub struct Upsample {
    cin: usize,
    cout: usize,
    /// `U[ξ]`, `4·cout × cin` (rows: parity, then output channel).
    weights: Vec<PackedWeights>,
}

impl Upsample {
    /// Whether a layer of this shape, on maps of this side, can run here:
    /// whole vectors of channels and whole tiles.
    pub fn fits(cin: usize, cout: usize, side: usize) -> bool {
        cin.is_multiple_of(LANES) && cout.is_multiple_of(LANES) && side.is_multiple_of(4) && side > 0
    }

    /// Floats of transformed weights a layer of this shape holds.
    pub fn weight_floats(cin: usize, cout: usize) -> usize {
        36 * 4 * cout * cin
    }

    /// `weight` is PyTorch's `cin × cout × 4 × 4` of a transposed
    /// convolution.
    pub fn new(weight: &[f32], cin: usize, cout: usize) -> Self {
        assert_eq!(
            weight.len(),
            cin * cout * 16,
            "transposed convolution weight has the wrong size"
        );
        let rows = 4 * cout;
        let mut u = vec![vec![0.0f32; rows * cin]; 36];
        for ci in 0..cin {
            for co in 0..cout {
                let w = &weight[(ci * cout + co) * 16..][..16];
                for p in 0..4 {
                    let (a, b) = (p / 2, p % 2);
                    // The 3x3 filter of parity (a, b): window row a + t is
                    // kernel row 3 - a - 2t, column b + u kernel column
                    // 3 - b - 2u; the other taps are zero.
                    let mut g = [[0.0f64; 3]; 3];
                    for t in 0..2 {
                        for v in 0..2 {
                            g[a + t][b + v] = f64::from(w[(3 - a - 2 * t) * 4 + 3 - b - 2 * v]);
                        }
                    }
                    for (xi, u) in u.iter_mut().enumerate() {
                        u[(p * cout + co) * cin + ci] = filter_transform(&G4, &g, xi / 6, xi % 6);
                    }
                }
            }
        }
        let weights = u.iter().map(|u| PackedWeights::from_rows(u, rows, cin)).collect();
        Self { cin, cout, weights }
    }

    /// The layer on `n` images of `side` (see [`Upsample::fits`]): `x` in,
    /// `out` (side `2·side`, its border left as it is) with `bias` added and,
    /// if `relu`, ReLU applied.
    pub fn forward(&self, x: &[f32], n: usize, side: usize, out: &mut [f32], bias: &[f32], relu: bool) {
        assert!(Self::fits(self.cin, self.cout, side), "no whole tiles");
        assert_eq!(
            x.len(),
            n * (side + 2) * (side + 2) * self.cin,
            "input has the wrong size"
        );
        assert_eq!(
            out.len(),
            n * (2 * side + 2) * (2 * side + 2) * self.cout,
            "output has the wrong size"
        );
        assert_eq!(bias.len(), self.cout, "bias has the wrong size");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, which is all
            // `forward_avx2` is compiled to use.
            #[allow(unsafe_code)]
            unsafe {
                self.forward_avx2(x, n, side, out, bias, relu);
            }
            return;
        }
        self.forward_any(x, n, side, out, bias, relu);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn forward_avx2(&self, x: &[f32], n: usize, side: usize, out: &mut [f32], bias: &[f32], relu: bool) {
        self.forward_any(x, n, side, out, bias, relu);
    }

    #[inline(always)]
    fn forward_any(&self, x: &[f32], n: usize, side: usize, out: &mut [f32], bias: &[f32], relu: bool) {
        let (cin, cout, rows) = (self.cin, self.cout, 4 * self.cout);
        let (tw, pw, ow) = (side / 4, side + 2, 2 * side + 2);
        let tiles = n * tw * tw;
        let chunk = (CHUNK_FLOATS / (36 * (cin + rows))).clamp(32, MAX_TILES).min(tiles);
        let mut v = vec![0.0f32; 36 * chunk * cin];
        let mut prod = vec![0.0f32; 36 * chunk * rows];
        for first in (0..tiles).step_by(chunk) {
            let len = chunk.min(tiles - first);
            // (image, row of tiles, column of tiles)
            let tile = |j: usize| {
                let t = first + j;
                (t / (tw * tw), t / tw % tw, t % tw)
            };
            for j in 0..len {
                let (img, ty, tx) = tile(j);
                let corner = ((img * pw + 4 * ty) * pw + 4 * tx) * cin;
                for c0 in (0..cin).step_by(LANES) {
                    let mut d = [V8::default(); 36];
                    for (k, value) in d.iter_mut().enumerate() {
                        *value = V8::load(&x[corner + ((k / 6) * pw + k % 6) * cin + c0..]);
                    }
                    for (k, value) in F4::input(&d).iter().enumerate() {
                        value.store(&mut v[(k * len + j) * cin + c0..]);
                    }
                }
            }
            for (k, weights) in self.weights.iter().enumerate() {
                let v = &v[k * len * cin..][..len * cin];
                weights.matmul_rows(v, len, &mut prod[k * len * rows..][..len * rows]);
            }
            for j in 0..len {
                let (img, ty, tx) = tile(j);
                for o0 in (0..rows).step_by(LANES) {
                    let (p, co) = (o0 / cout, o0 % cout);
                    let (a, b) = (p / 2, p % 2);
                    let mut m = [V8::default(); 36];
                    for (k, value) in m.iter_mut().enumerate() {
                        *value = V8::load(&prod[(k * len + j) * rows + o0..]);
                    }
                    let add = V8::load(&bias[co..]);
                    let y = F4::output(&m);
                    for (i, line) in y.chunks_exact(4).enumerate() {
                        // Output row 2(4·ty + i) + a, in padded coordinates.
                        let row = (img * ow + 2 * (4 * ty + i) + a + 1) * ow;
                        for (c, value) in line.iter().enumerate() {
                            let mut value = *value + add;
                            if relu {
                                value = value.map2(value, |v, _| v.max(0.0));
                            }
                            value.store(&mut out[(row + 2 * (4 * tx + c) + b + 1) * cout + co..]);
                        }
                    }
                }
            }
        }
    }
}

/// `V = Bᵀ d B` of every tile at `at` and every channel, into the rows of
/// each position's product: position ξ, tile j, channel ci at
/// `v[(ξ·n + j)·depth + ci]`.
#[inline(always)]
fn transform_input<K: Kind>(grid: &Grid, at: &[(usize, usize)], v: &mut [f32]) {
    let (a, depth, n) = (K::A, grid.depth, at.len());
    let row = grid.pw * depth;
    for (j, (ty, tx)) in at.iter().enumerate() {
        let corner = (ty * K::M * grid.pw + tx * K::M) * depth;
        for c0 in (0..depth).step_by(LANES) {
            let mut d = [V8::default(); 36];
            for r in 0..a {
                for c in 0..a {
                    d[r * a + c] = V8::load(&grid.padded[corner + r * row + c * depth + c0..]);
                }
            }
            let t = K::input(&d);
            for (k, value) in t[..a * a].iter().enumerate() {
                value.store(&mut v[(k * n + j) * depth + c0..]);
            }
        }
    }
}

/// `Y = Aᵀ M A` of every output channel of the tiles at `at`, with bias and
/// activation, into the output rows from `row0` on.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn transform_output<K: Kind>(
    prod: &[f32],
    grid: &Grid,
    cout: usize,
    at: &[(usize, usize)],
    row0: usize,
    planes: &mut [&mut [f32]],
) {
    let (a, m, n) = (K::A, K::M, at.len());
    for (j, (ty, tx)) in at.iter().enumerate() {
        // The part of the tile inside the output.
        let rows = m.min(grid.h - ty * m);
        let cols = m.min(grid.w - tx * m);
        for c0 in (0..cout).step_by(LANES) {
            let mut mm = [V8::default(); 36];
            for (k, value) in mm[..a * a].iter_mut().enumerate() {
                *value = V8::load(&prod[(k * n + j) * cout + c0..]);
            }
            let b = V8::load(&grid.bias[c0..]);
            let y = K::output(&mm);
            for i in 0..rows {
                let start = (ty * m + i - row0) * grid.w + tx * m;
                for c in 0..cols {
                    let mut v = y[i * m + c] + b;
                    if let Activation::PRelu(alpha) = grid.activation {
                        let alpha = V8::load(&alpha[c0..]);
                        v = v.map2(alpha, |x, s| if x > 0.0 { x } else { s * x });
                    }
                    for (l, x) in v.0.iter().enumerate() {
                        planes[c0 + l][start + c] = *x;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factored line transforms are `Bᵀ` and `Aᵀ` as published.
    fn lines_match<K: Kind, const A: usize, const M: usize>(bt: &[[f32; A]; A], at: &[[f32; A]; M]) {
        for unit in 0..A {
            let line: [V8; 6] = std::array::from_fn(|i| V8([if i == unit { 1.0 } else { 0.0 }; LANES]));
            let v = K::input_line(line);
            let y = K::output_line(line);
            for i in 0..A {
                assert_eq!(v[i].0[0], bt[i][unit], "Bᵀ[{i}][{unit}] of a {A}-tile");
            }
            for i in 0..M {
                assert_eq!(y[i].0[0], at[i][unit], "Aᵀ[{i}][{unit}] of a {A}-tile");
            }
        }
    }

    #[test]
    fn the_factored_transforms_are_the_published_matrices() {
        lines_match::<F2, 4, 2>(&BT2, &AT2);
        lines_match::<F4, 6, 4>(&BT4, &AT4);
    }
}
