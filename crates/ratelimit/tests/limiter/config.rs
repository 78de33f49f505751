//! Config structs deserialize from TOML with the documented defaults.

use gantry_ratelimit::{FailMode, Policy, RedisConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Settings {
    #[serde(default)]
    policy: Policy,
    #[serde(default)]
    fail_mode: FailMode,
    #[serde(default)]
    redis: RedisConfig,
}

#[test]
fn defaults_apply_when_sections_or_fields_are_missing() {
    let s: Settings = toml::from_str("").unwrap();
    assert_eq!(s.policy, Policy::new(600, 20_000, 200_000));
    assert_eq!(Policy::default(), Policy::new(600, 20_000, 200_000));
    assert_eq!(s.fail_mode, FailMode::Open);
    assert_eq!(s.redis.timeout_ms, 50);
    assert_eq!(s.redis.key_prefix, "gantry:rl");

    let s: Settings = toml::from_str(
        "fail_mode = \"closed\"\n[policy]\nminute = 10\n[redis]\nurl = \"redis://h:1\"\ntimeout_ms = 20\n",
    )
    .unwrap();
    assert_eq!(s.policy, Policy::new(10, 20_000, 200_000));
    assert_eq!(s.fail_mode, FailMode::Closed);
    assert_eq!(s.redis.url, "redis://h:1");
    assert_eq!(s.redis.timeout_ms, 20);
    assert_eq!(s.redis.connections, RedisConfig::default().connections);
}

#[test]
fn typos_are_rejected() {
    assert!(toml::from_str::<Settings>("[policy]\nminutes = 10\n").is_err());
    assert!(toml::from_str::<Settings>("[redis]\ntimeout = 10\n").is_err());
    assert!(toml::from_str::<Settings>("fail_mode = \"sideways\"\n").is_err());
}
