//! Property tests: no input makes the loader (or its error rendering) panic.

use std::path::{Path, PathBuf};

use mcpd::unit::{self, Style, UnitFiles};
use proptest::prelude::*;

fn load_bytes(main: &[u8], dropin: Option<&[u8]>) {
    let files = UnitFiles {
        main: PathBuf::from("/fuzz/unit.kdl"),
        dropins: dropin
            .map(|_| PathBuf::from("/fuzz/unit.kdl.d/10.kdl"))
            .into_iter()
            .collect(),
    };
    let read = |path: &Path| -> std::io::Result<Vec<u8>> {
        if path.ends_with("unit.kdl") {
            Ok(main.to_vec())
        } else {
            Ok(dropin.unwrap_or_default().to_vec())
        }
    };
    if let Err(e) = unit::load_with(&files, &unit::Context::default(), read) {
        // Rendering walks spans into the text: it must not panic either.
        let _ = e.render(Style::Plain);
        let _ = e.to_string();
        assert!(!e.problems().is_empty());
    }
}

/// Fragments that steer random text into the interesting parts of the grammar.
fn kdlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("description ".to_owned()),
        Just("stdio ".to_owned()),
        Just("http ".to_owned()),
        Just("reconnect ".to_owned()),
        Just("command ".to_owned()),
        Just("env ".to_owned()),
        Just("env-file ".to_owned()),
        Just("pass-env ".to_owned()),
        Just("header ".to_owned()),
        Just("user ".to_owned()),
        Just("working-directory ".to_owned()),
        Just("enabled ".to_owned()),
        Just("initial-delay ".to_owned()),
        Just("max-delay ".to_owned()),
        Just("max-attempts ".to_owned()),
        Just("startup-timeout ".to_owned()),
        Just("stop-timeout ".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("\n".to_owned()),
        Just(";".to_owned()),
        Just("/-".to_owned()),
        Just("(ty)".to_owned()),
        Just("#true ".to_owned()),
        Just("true ".to_owned()),
        Just("#null ".to_owned()),
        Just("A=".to_owned()),
        Just("\"500ms\" ".to_owned()),
        Just("\"/bin/cat\" ".to_owned()),
        Just("\"https://h/mcp\" ".to_owned()),
        any::<i64>().prop_map(|i| format!("{i} ")),
        "[ -~]{0,8}",
        "\\PC{0,4}",
    ];
    prop::collection::vec(token, 0..40).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(main in prop::collection::vec(any::<u8>(), 0..256)) {
        load_bytes(&main, None);
    }

    #[test]
    fn kdl_like_text_never_panics(main in kdlish(), dropin in kdlish()) {
        load_bytes(main.as_bytes(), Some(dropin.as_bytes()));
    }
}
