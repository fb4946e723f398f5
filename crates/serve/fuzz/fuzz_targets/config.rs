#![no_main]
//! `blockwire serve`'s configuration: arbitrary text as the TOML file, then
//! validation; and each line as a `--volume`/`--aoe` flag and a listen
//! address. Never panics; a configuration that loads saves (TOML, and the
//! JSON of --print-config/--save-config with --show-secrets) to text that
//! loads back to the same configuration with the same verdict; the
//! redacted JSON names no secret.
use bw_serve::config::{parse_listen, reveal_secrets, ServeConfig, REDACTED};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = toml::from_str::<ServeConfig>(text) {
        let valid = c.validate().is_ok();
        if let Ok(saved) = reveal_secrets(|| toml::to_string(&c)) {
            let back: ServeConfig = toml::from_str(&saved).unwrap_or_else(|e| panic!("saved TOML does not load: {e}\n{saved}"));
            assert_eq!(back, c);
            assert_eq!(back.validate().is_ok(), valid);
        }
        let json = c.to_json(true);
        let back: ServeConfig = serde_json::from_str(&json).unwrap_or_else(|e| panic!("--show-secrets JSON does not load: {e}\n{json}"));
        assert_eq!(back, c);
        let redacted = c.to_json(false);
        assert_eq!(c.has_secrets(), redacted.contains(REDACTED) && serde_json::from_str::<ServeConfig>(&redacted).is_err());
    }
    let mut c = ServeConfig::default();
    for line in text.lines().take(16) {
        let _ = c.add_volume_flag(line);
        let _ = c.add_aoe_flag(line);
        let _ = parse_listen(line, 3260);
    }
    let _ = c.validate();
});
