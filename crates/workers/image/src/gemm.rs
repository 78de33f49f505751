//! A safe, bounds-checked front for matrixmultiply's single-precision GEMM.

/// A dense `rows × cols` matrix view over `data`, addressed by strides
/// (element `(r, c)` is `data[r * row_stride + c * col_stride]`).
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl View<'_> {
    /// Whether every element the view addresses lies inside `data`.
    fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = (self.rows - 1)
            .checked_mul(self.row_stride)
            .zip((self.cols - 1).checked_mul(self.col_stride))
            .and_then(|(a, b)| a.checked_add(b));
        last.is_some_and(|last| last < self.data.len())
    }
}

/// `c = a × b` where `c` is row-major `a.rows × b.cols` (overwritten).
///
/// # Panics
/// When the shapes do not agree or a view reaches outside its slice: both are
/// programming errors of the caller.
pub fn matmul(a: View<'_>, b: View<'_>, c: &mut [f32]) {
    assert_eq!(a.cols, b.rows, "inner dimensions differ");
    assert!(a.in_bounds() && b.in_bounds(), "a matrix view reaches outside its data");
    assert_eq!(c.len(), a.rows * b.cols, "output has the wrong size");
    let to_isize = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
    if a.rows == 0 || b.cols == 0 {
        return;
    }
    // SAFETY: the assertions above keep every element that sgemm reads
    // (a: rows × cols through its strides, b likewise) inside its slice, and
    // every element it writes (c: a.rows × b.cols, row-major) inside `c`; the
    // slices are borrowed for the whole call and `c` is exclusive.
    #[allow(unsafe_code)]
    unsafe {
        matrixmultiply::sgemm(
            a.rows,
            a.cols,
            b.cols,
            1.0,
            a.data.as_ptr(),
            to_isize(a.row_stride),
            to_isize(a.col_stride),
            b.data.as_ptr(),
            to_isize(b.row_stride),
            to_isize(b.col_stride),
            0.0,
            c.as_mut_ptr(),
            to_isize(b.cols),
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_schoolbook_product() {
        // a: 2x3 stored transposed (column-major), b: 3x2 row-major
        let a_t = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
        let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let mut c = [0.0; 4];
        matmul(
            View {
                data: &a_t,
                rows: 2,
                cols: 3,
                row_stride: 1,
                col_stride: 2,
            },
            View {
                data: &b,
                rows: 3,
                cols: 2,
                row_stride: 2,
                col_stride: 1,
            },
            &mut c,
        );
        assert_eq!(c, [58.0, 64.0, 139.0, 154.0]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_view_past_its_data_is_refused() {
        let a = [1.0; 5];
        let mut c = [0.0; 4];
        matmul(
            View {
                data: &a,
                rows: 2,
                cols: 3,
                row_stride: 3,
                col_stride: 1,
            },
            View {
                data: &[1.0; 6],
                rows: 3,
                cols: 2,
                row_stride: 2,
                col_stride: 1,
            },
            &mut c,
        );
    }
}
