//! Kubernetes resource quantities (`500m`, `1.5Gi`, `1e3`, `128M`), parsed
//! the way `resource.Quantity` does: a signed decimal number, then a binary
//! suffix (Ki..Ei), a decimal suffix (n u m "" k M G T P E), or an exponent
//! (`e3`, `E-2`). Values are exact; conversion to whole units rounds up, as
//! `Quantity.Value()` / `MilliValue()` do.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error("invalid quantity {0:?}")]
    Invalid(String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

/// An exact non-negative quantity: `mantissa × 2^bin × 10^dec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    mantissa: u128,
    dec: i32,
    bin: u32,
}

const MAX_DIGITS: usize = 40;

impl Quantity {
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let invalid = || QuantityError::Invalid(text.to_string());
        let s = text.trim();
        if s.is_empty() || s.len() > 64 {
            return Err(invalid());
        }
        let (negative, s) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(num_end);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(invalid());
        }
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return Err(QuantityError::TooLarge(text.to_string()));
        }
        let mantissa: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| invalid())?
        };
        // `s` is at most 64 bytes, so this never fails; the error keeps it honest.
        let mut dec =
            -i32::try_from(frac.len()).map_err(|_| QuantityError::TooLarge(text.to_string()))?;
        let mut bin = 0;
        match suffix {
            "" => {}
            "Ki" => bin = 10,
            "Mi" => bin = 20,
            "Gi" => bin = 30,
            "Ti" => bin = 40,
            "Pi" => bin = 50,
            "Ei" => bin = 60,
            "n" => dec -= 9,
            "u" => dec -= 6,
            "m" => dec -= 3,
            "k" => dec += 3,
            "M" => dec += 6,
            "G" => dec += 9,
            "T" => dec += 12,
            "P" => dec += 15,
            "E" => dec += 18,
            exp if exp.starts_with(['e', 'E']) => {
                let e: i32 = exp[1..].parse().map_err(|_| invalid())?;
                if !(-30..=30).contains(&e) || exp[1..].starts_with('+') && exp.len() == 2 {
                    return Err(invalid());
                }
                dec += e;
            }
            _ => return Err(invalid()),
        }
        if negative && mantissa != 0 {
            return Err(QuantityError::Negative(text.to_string()));
        }
        Ok(Quantity { mantissa, dec, bin })
    }

    /// The value in units of 10^`scale` (0 = whole units, -3 = milli),
    /// rounded up like resource.Quantity; `None` if it does not fit in u64.
    pub fn scaled(&self, scale: i32) -> Option<u64> {
        let mut num: u128 = self.mantissa.checked_mul(1u128.checked_shl(self.bin)?)?;
        let exp = self.dec - scale;
        if exp >= 0 {
            num = num.checked_mul(10u128.checked_pow(exp.unsigned_abs())?)?;
            u64::try_from(num).ok()
        } else {
            let div = 10u128.checked_pow(exp.unsigned_abs())?;
            u64::try_from(num.div_ceil(div)).ok()
        }
    }

    /// Whole units (bytes for memory), rounded up.
    pub fn value(&self) -> Option<u64> {
        self.scaled(0)
    }

    /// Thousandths (millicores for CPU), rounded up.
    pub fn milli_value(&self) -> Option<u64> {
        self.scaled(-3)
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }
}

/// Parses and converts in one step; errors name the text.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    Quantity::parse(text)?
        .value()
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
}

pub fn parse_milli(text: &str) -> Result<u64, QuantityError> {
    Quantity::parse(text)?
        .milli_value()
        .ok_or_else(|| QuantityError::TooLarge(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn memory_forms() {
        for (text, bytes) in [
            ("128Mi", 134_217_728u64),
            ("1Gi", 1 << 30),
            ("1.5Gi", 1_610_612_736),
            ("128M", 128_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("12e-1", 2), // 1.2 rounds up
            ("0.5", 1),
            ("1k", 1000),
            ("1Ki", 1024),
            ("100", 100),
            ("+5", 5),
            ("0", 0),
            ("0Gi", 0),
            ("16Gi", 17_179_869_184),
            ("1Ei", 1 << 60),
            ("  64Mi ", 64 << 20),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn cpu_forms() {
        for (text, milli) in [
            ("500m", 500u64),
            ("1", 1000),
            ("0.1", 100),
            ("1.5", 1500),
            ("250m", 250),
            ("1e3", 1_000_000),
            ("100u", 1), // rounds up
            ("2k", 2_000_000),
            (".5", 500),
            ("5.", 5000),
        ] {
            assert_eq!(parse_milli(text), Ok(milli), "{text}");
        }
    }

    #[test]
    fn junk_is_rejected_with_the_text() {
        for text in [
            "", "m", "Gi", "1x", "12x", "1.2.3", "1 Gi", "--1", "1iG", "1e", "1e+", "0x10", "1gi",
            "one", "1e999", "NaN", "inf", "1Mii",
        ] {
            let err = parse_bytes(text).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{:?}", text.trim())),
                "{text}: {err}"
            );
        }
        assert!(matches!(parse_bytes("-1"), Err(QuantityError::Negative(_))));
        assert!(matches!(
            parse_bytes("100Ei"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,30}") {
            let _ = Quantity::parse(&s).map(|q| (q.value(), q.milli_value()));
        }

        #[test]
        fn binary_suffixes_scale_exactly(n in 0u64..1_000_000, i in 0usize..4) {
            let (suf, shift) = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)][i];
            prop_assert_eq!(parse_bytes(&format!("{n}{suf}")), Ok(n << shift));
        }

        #[test]
        fn milli_and_units_agree(n in 0u64..10_000_000) {
            let q = Quantity::parse(&format!("{n}m")).unwrap();
            prop_assert_eq!(q.milli_value(), Some(n));
            prop_assert_eq!(q.value(), Some(n.div_ceil(1000)));
        }
    }
}
