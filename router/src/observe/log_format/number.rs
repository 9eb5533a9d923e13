//! Numbers in log lines, written exactly as `core::fmt` writes them (`{}` for integers, `{:?}`
//! for floats) but as one string from a stack buffer, without `core::fmt`'s formatter machinery:
//! every access line writes several of each.

use std::fmt;

/// Longest decimal `u64` (`18446744073709551615`), and a sign.
const MAX_DIGITS: usize = 21;

/// The decimal digits of `v` at the end of `buf`; where they start.
fn digits(buf: &mut [u8], mut v: u64) -> usize {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return at;
        }
    }
}

/// Writes `buf[at..]`, which holds ASCII only.
fn ascii(w: &mut impl fmt::Write, buf: &[u8], at: usize) -> fmt::Result {
    w.write_str(std::str::from_utf8(&buf[at..]).map_err(|_| fmt::Error)?)
}

/// `v` as `{}` writes it.
pub(super) fn write_u64(w: &mut impl fmt::Write, v: u64) -> fmt::Result {
    let mut buf = [0; MAX_DIGITS];
    let at = digits(&mut buf, v);
    ascii(w, &buf, at)
}

/// `v` as `{}` writes it.
pub(super) fn write_i64(w: &mut impl fmt::Write, v: i64) -> fmt::Result {
    let mut buf = [0; MAX_DIGITS];
    let mut at = digits(&mut buf, v.unsigned_abs());
    if v < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    ascii(w, &buf, at)
}

/// 2^40: below it doubles are at most 2^-13 apart, far closer than two thousandths, so a value
/// that is the nearest double to some `k / 1000` has that decimal as its shortest form.
const THOUSANDTHS_EXACT_BELOW: f64 = 1_099_511_627_776.0;

/// `v` as `{:?}` writes it. A non-negative value below 2^40 that is the nearest double to a
/// number of thousandths (the log's milliseconds, rounded to the microsecond) is written from
/// that integer: its shortest round-trip decimal is those thousandths, trailing zeros cut but
/// one kept (`2.0`, `0.25`, `13.107`), which is what `{:?}` writes. Anything else goes through
/// `core::fmt`.
pub(super) fn write_f64(w: &mut impl fmt::Write, v: f64) -> fmt::Result {
    if v.is_sign_positive() && v < THOUSANDTHS_EXACT_BELOW {
        let k = (v * 1000.0).round();
        if k / 1000.0 == v {
            // Below 2^50, so the cast is exact.
            let k = k as u64;
            let (whole, frac) = (k / 1000, k % 1000);
            let frac_digits = [
                b'0' + (frac / 100) as u8,
                b'0' + (frac / 10 % 10) as u8,
                b'0' + (frac % 10) as u8,
            ];
            let kept = match frac {
                f if f % 100 == 0 => 1,
                f if f % 10 == 0 => 2,
                _ => 3,
            };
            let mut buf = [0; MAX_DIGITS];
            let point = buf.len() - 1 - kept;
            buf[point + 1..].copy_from_slice(&frac_digits[..kept]);
            buf[point] = b'.';
            let at = digits(&mut buf[..point], whole);
            return ascii(w, &buf, at);
        }
    }
    write!(w, "{v:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(v: u64) -> String {
        let mut s = String::new();
        write_u64(&mut s, v).expect("write");
        s
    }

    fn i(v: i64) -> String {
        let mut s = String::new();
        write_i64(&mut s, v).expect("write");
        s
    }

    fn f(v: f64) -> String {
        let mut s = String::new();
        write_f64(&mut s, v).expect("write");
        s
    }

    #[test]
    fn integers_are_written_as_core_fmt_writes_them() {
        let edges = [
            0,
            1,
            9,
            10,
            99,
            100,
            999_999,
            1 << 32,
            u64::MAX - 1,
            u64::MAX,
        ];
        for v in edges.into_iter().chain((0..100_000).map(|k| k * 7919)) {
            assert_eq!(u(v), v.to_string());
        }
        for v in [
            0,
            1,
            -1,
            10,
            -10,
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            -1_234_567,
        ] {
            assert_eq!(i(v), v.to_string());
        }
    }

    #[test]
    fn floats_are_written_as_debug_writes_them() {
        // Every thousandth to 2,000 (the fast path), both sides of the bound, and values the
        // fast path must leave to core::fmt: more decimals, negative, tiny, huge, not finite.
        let ms = |d: f64| (d * 1e3).round() / 1e3;
        let mut values: Vec<f64> = (0..2_000_000).map(|k| k as f64 / 1000.0).collect();
        values.extend((0..200_000u64).map(|k| ms(k as f64 * 0.000_713 + k as f64 * 1.37)));
        values.extend([
            THOUSANDTHS_EXACT_BELOW - 0.001,
            THOUSANDTHS_EXACT_BELOW,
            THOUSANDTHS_EXACT_BELOW + 0.5,
            999_999_999_999.999,
            123_456_789.123_4,
            0.000_1,
            1e-7,
            -0.0,
            -1.5,
            -0.001,
            1e16,
            1e300,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.1 + 0.2,
        ]);
        for v in values {
            assert_eq!(f(v), format!("{v:?}"), "{v:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_double_is_written_as_debug_writes_it(bits: u64) {
            let v = f64::from_bits(bits);
            proptest::prop_assert_eq!(f(v), format!("{v:?}"));
        }

        #[test]
        fn any_duration_in_milliseconds_is_written_as_debug_writes_it(ns in 0u64..(1 << 62)) {
            // As the access log computes it.
            let v = (std::time::Duration::from_nanos(ns).as_secs_f64() * 1e6).round() / 1e3;
            proptest::prop_assert_eq!(f(v), format!("{v:?}"));
        }
    }
}
