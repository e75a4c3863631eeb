//! Our quantity unit tests' tables (src/qos/quantity.rs, tests module) and
//! kubelet-qos.md's cases run through kube_quantity: prints every input
//! where it disagrees with resource.Quantity's answer, then a count.
use kube_quantity::ParsedQuantity;

fn bytes(s: &str) -> Option<u64> {
    ParsedQuantity::try_from(s).ok()?.to_bytes_u64()
}

fn milli(s: &str) -> Option<u64> {
    (ParsedQuantity::try_from(s).ok()? * 1000).to_bytes_u64()
}

fn main() {
    let mut cases = 0;
    let mut wrong = 0;
    let mut check = |what: &str, text: &str, want: Option<u64>, got: Option<u64>| {
        cases += 1;
        if want != got {
            wrong += 1;
            println!("{what:6} {text:>22?}: ours (tests) {want:?}, kube_quantity {got:?}");
        }
    };
    // memory_forms
    for (text, want) in [
        ("128Mi", 134_217_728u64),
        ("1Gi", 1 << 30),
        ("1.5Gi", 1_610_612_736),
        ("128M", 128_000_000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("12e-1", 2),
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
        // exactness beyond f64's 53-bit mantissa (a 2^53+1 byte limit)
        ("9007199254740993", 9_007_199_254_740_993),
    ] {
        check("bytes", text, Some(want), bytes(text));
    }
    // cpu_forms
    for (text, want) in [
        ("500m", 500u64),
        ("1", 1000),
        ("0.1", 100),
        ("1.5", 1500),
        ("250m", 250),
        ("1e3", 1_000_000),
        ("100u", 1),
        ("2k", 2_000_000),
        (".5", 500),
        ("5.", 5000),
    ] {
        check("milli", text, Some(want), milli(text));
    }
    // junk_is_rejected_with_the_text (and negative, and too large)
    for text in [
        "", "m", "Gi", "1x", "12x", "1.2.3", "1 Gi", "--1", "1iG", "1e", "1e+", "0x10", "1gi",
        "one", "1e999", "NaN", "inf", "1Mii", "-1", "100Ei",
    ] {
        check("reject", text, None, bytes(text));
    }
    println!("{wrong} of {cases} cases differ from our tests");
}
