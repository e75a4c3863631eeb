use super::*;
use crate::pressure::config::SizeOrPercent;
use clap::Parser;

#[test]
fn empty_file_gives_defaults() {
    assert_eq!(
        Config::from_toml("", Path::new("x.toml")).unwrap(),
        Config::default()
    );
}

#[test]
fn unknown_key_names_key_and_file() {
    let err = Config::from_toml("[plugin]\nsockett = \"/x\"\n", Path::new("/etc/x.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("sockett"), "{err}");
    assert!(err.contains("/etc/x.toml"), "{err}");
}

#[test]
fn bad_values_name_the_field() {
    let err = Config::from_toml("[plugin]\nindex = \"7\"\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("plugin.index"), "{err}");
    let err = Config::from_toml("[plugin]\nlog-format = \"xml\"\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("plugin.log-format"), "{err}");
}

#[test]
fn non_finite_and_out_of_range_shares_are_refused_everywhere() {
    for v in ["nan", "-1.0", "7.0", "0.0", "inf", "-inf"] {
        let text = format!("[hierarchy]\nbudget-share = {v}\n");
        let err = Config::from_toml(&text, Path::new("c.toml"))
            .expect_err(v)
            .to_string();
        assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
        let err = Config::default()
            .apply_env(env(&[("NRI_QOS_HIERARCHY_BUDGET_SHARE", v)]))
            .expect_err(v)
            .to_string();
        assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
        // The runtime's drop-in config is checked the same way.
        let err = layer_drop_in(&Default::default(), false, &text)
            .expect_err(v)
            .to_string();
        assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
    }
    // The other float keys already were; keep them so.
    for text in [
        "[policy]\nmemory-throttling-factor = nan\n",
        "[monitor]\nbesteffort-memory-high-factor = nan\n",
        "[monitor]\nhard-threshold = \"nan%\"\n",
        "[monitor]\nsoft-threshold = \"inf%\"\n",
    ] {
        assert!(
            Config::from_toml(text, Path::new("c.toml")).is_err(),
            "{text}"
        );
    }
    let cfg = Config::from_toml("[hierarchy]\nbudget-share = 1.0\n", Path::new("c.toml"));
    assert!(cfg.is_ok());
}

#[test]
fn validation_gaps_are_errors_naming_the_key() {
    let table: &[(&str, &str)] = &[
        ("[plugin]\nlog-level = \"(((\"\n", "plugin.log-level"),
        ("[plugin]\nlog-level = \"\"\n", "plugin.log-level"),
        ("[plugin]\nsocket = \"\"\n", "plugin.socket"),
        ("[plugin]\nsync-budget-mib = 0\n", "plugin.sync-budget-mib"),
        (
            "[plugin]\nsync-budget-mib = 4096\n",
            "plugin.sync-budget-mib",
        ),
        ("[node]\ncgroup-root = \"\"\n", "node.cgroup-root"),
        ("[node]\nproc-root = \"\"\n", "node.proc-root"),
        (
            "[hierarchy]\nresync-seconds = 9223372036854775807\n",
            "hierarchy.resync-seconds",
        ),
        (
            "[hierarchy]\nresync-seconds = 0\n",
            "hierarchy.resync-seconds",
        ),
        ("[monitor]\nkubepods = \"../../etc\"\n", "monitor.kubepods"),
        (
            "[monitor]\nkubepods = \"/kubepods.slice/../../etc\"\n",
            "monitor.kubepods",
        ),
        ("[monitor]\ncooldown = \"999999999m\"\n", "monitor.cooldown"),
        (
            "[monitor]\ntransition-period = \"2000000s\"\n",
            "monitor.transition-period",
        ),
        (
            "[monitor]\nhard-threshold = \"300Mi\"\nsoft-threshold = \"100Mi\"\n",
            "monitor.soft-threshold",
        ),
        (
            "[monitor]\nhard-threshold = \"10%\"\nsoft-threshold = \"5%\"\n",
            "monitor.soft-threshold",
        ),
    ];
    for (text, key) in table {
        let err = Config::from_toml(text, Path::new("c.toml"))
            .expect_err(text)
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    for ok in [
        "[monitor]\nkubepods = \"/kubepods.slice\"\n",
        "[monitor]\nsoft-threshold = \"0\"\n",
        "[hierarchy]\nresync-seconds = 3600\n",
        "[plugin]\nlog-level = \"nri_qos=debug,warn\"\n",
    ] {
        Config::from_toml(ok, Path::new("c.toml")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    // The environment layer ends in the same validation.
    let mut cfg = Config::default();
    cfg.apply_env(env(&[("NRI_QOS_PLUGIN_LOG_LEVEL", "(((")]))
        .unwrap();
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("plugin.log-level"), "{err}");
}

#[test]
fn metrics_section_parses_and_defaults_off() {
    let cfg = Config::from_toml(
        "[metrics]\nenabled = true\naddress = \"[::1]:9000\"\n",
        Path::new("c.toml"),
    )
    .unwrap();
    assert!(cfg.metrics.enabled);
    assert_eq!(cfg.metrics.address, "[::1]:9000".parse().unwrap());
    let d = MetricsConfig::default();
    assert!(!d.enabled);
    assert_eq!(d.address.to_string(), DEFAULT_METRICS_ADDRESS);
}

#[test]
fn non_loopback_metrics_address_is_refused() {
    for addr in ["0.0.0.0:9464", "10.0.0.1:9464", "[::]:9464"] {
        let text = format!("[metrics]\naddress = \"{addr}\"\n");
        let err = Config::from_toml(&text, Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics.address"), "{addr}: {err}");
    }
}

fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<Vec<_>>()
        .into_iter()
}

#[test]
fn env_sets_each_field() {
    type Check = fn(&Config) -> bool;
    let table: &[(&str, &str, Check)] = &[
        ("NRI_QOS_PLUGIN_NAME", "qos", |c| c.plugin.name == "qos"),
        ("NRI_QOS_PLUGIN_INDEX", "42", |c| c.plugin.index == "42"),
        ("NRI_QOS_PLUGIN_SOCKET", "/run/x.sock", |c| {
            c.plugin.socket == Path::new("/run/x.sock")
        }),
        ("NRI_QOS_PLUGIN_DRY_RUN", "true", |c| c.plugin.dry_run),
        ("NRI_QOS_PLUGIN_DRY_RUN", "1", |c| c.plugin.dry_run),
        ("NRI_QOS_PLUGIN_DRY_RUN", "YES", |c| c.plugin.dry_run),
        ("NRI_QOS_PLUGIN_ADJUST_EXISTING", "off", |c| {
            !c.plugin.adjust_existing
        }),
        ("NRI_QOS_PLUGIN_LOG_FORMAT", "json", |c| {
            c.plugin.log_format == LogFormat::Json
        }),
        ("NRI_QOS_PLUGIN_LOG_LEVEL", "nri_qos=debug", |c| {
            c.plugin.log_level == "nri_qos=debug"
        }),
        ("NRI_QOS_PLUGIN_SYNC_BUDGET_MIB", "16", |c| {
            c.plugin.sync_budget_bytes() == 16 << 20
        }),
        ("NRI_QOS_PLUGIN_LOG_FILE", "/var/log/q.log", |c| {
            c.plugin.log_file.as_deref() == Some(Path::new("/var/log/q.log"))
        }),
        ("NRI_QOS_PLUGIN_LOG_FILE", "", |c| {
            c.plugin.log_file.is_none()
        }),
        ("NRI_QOS_NODE_CGROUP_ROOT", "/host/sys/fs/cgroup", |c| {
            c.node.cgroup_root == Path::new("/host/sys/fs/cgroup")
        }),
        ("NRI_QOS_NODE_PROC_ROOT", "/host/proc", |c| {
            c.node.proc_root == Path::new("/host/proc")
        }),
        ("NRI_QOS_NODE_MEMORY_ALLOCATABLE", "1073741824", |c| {
            c.node.memory_allocatable == 1 << 30
        }),
        ("NRI_QOS_HIERARCHY_ENABLED", "false", |c| {
            !c.hierarchy.enabled
        }),
        ("NRI_QOS_HIERARCHY_BUDGET_SHARE", "0.5", |c| {
            c.hierarchy.budget_share == 0.5
        }),
        ("NRI_QOS_HIERARCHY_RESERVE_BYTES", "0", |c| {
            c.hierarchy.reserve_bytes == 0
        }),
        ("NRI_QOS_HIERARCHY_RESYNC_SECONDS", "5", |c| {
            c.hierarchy.resync_seconds == 5
        }),
        ("NRI_QOS_METRICS_ENABLED", "on", |c| c.metrics.enabled),
        ("NRI_QOS_METRICS_ADDRESS", "127.0.0.1:1234", |c| {
            c.metrics.address.port() == 1234
        }),
        ("NRI_QOS_KUBERNETES_ENABLED", "false", |c| {
            !c.kubernetes.enabled
        }),
        ("NRI_QOS_KUBERNETES_KUBECONFIG", "/etc/k.conf", |c| {
            c.kubernetes.kubeconfig.as_deref() == Some(Path::new("/etc/k.conf"))
        }),
        ("NRI_QOS_KUBERNETES_NODE_NAME", "n1", |c| {
            c.kubernetes.node_name == "n1"
        }),
        ("NRI_QOS_KUBERNETES_EVICT", "no", |c| !c.kubernetes.evict),
    ];
    for (var, value, check) in table {
        let mut cfg = Config::default();
        cfg.apply_env(env(&[(var, value)]))
            .unwrap_or_else(|e| panic!("{var}={value}: {e}"));
        assert!(check(&cfg), "{var}={value:?} not applied");
    }
    // Every mapped variable is covered by the table above.
    for (var, _) in env_variables() {
        assert!(table.iter().any(|(v, _, _)| *v == var), "{var} untested");
    }
}

#[test]
fn env_errors_name_the_variable_and_field() {
    let table: &[(&str, &str, &[&str])] = &[
        (
            "NRI_QOS_PLUGIN_SOKET",
            "/x",
            &["NRI_QOS_PLUGIN_SOKET", "unknown"],
        ),
        (
            "NRI_QOS_METRICS_ADRESS",
            "127.0.0.1:1",
            &["NRI_QOS_METRICS_ADRESS"],
        ),
        ("NRI_QOS_POLICY_MEMORY_HIGH", "false", &["file-only"]),
        ("NRI_QOS_MONITOR_DRY_RUN", "true", &["file-only"]),
        ("NRI_QOS_NODE", "x", &["NRI_QOS_NODE"]),
        (
            "NRI_QOS_PLUGIN_DRY_RUN",
            "maybe",
            &["NRI_QOS_PLUGIN_DRY_RUN", "plugin.dry-run"],
        ),
        (
            "NRI_QOS_NODE_MEMORY_ALLOCATABLE",
            "-1",
            &["node.memory-allocatable"],
        ),
        (
            "NRI_QOS_HIERARCHY_BUDGET_SHARE",
            "half",
            &["hierarchy.budget-share"],
        ),
        (
            "NRI_QOS_METRICS_ADDRESS",
            "localhost:9464",
            &["metrics.address"],
        ),
        ("NRI_QOS_PLUGIN_SOCKET", "", &["plugin.socket", "empty"]),
        (
            "NRI_QOS_PLUGIN_LOG_FORMAT",
            "xml",
            &["NRI_QOS_PLUGIN_LOG_FORMAT", "plugin.log-format", "\"xml\""],
        ),
    ];
    for (var, value, needles) in table {
        let err = Config::default()
            .apply_env(env(&[(var, value)]))
            .expect_err(var)
            .to_string();
        for n in *needles {
            assert!(err.contains(n), "{var}={value:?}: {err}");
        }
    }
}

#[test]
fn env_ignores_other_variables_and_reserved_ones() {
    let mut cfg = Config::default();
    cfg.apply_env(env(&[
        ("PATH", "/bin"),
        ("NRI_PLUGIN_NAME", "x"),
        ("NRI_QOS_CONFIG", "/etc/other.toml"),
        // Tooling variables sharing our prefix.
        ("NRI_QOS_E2E", "1"),
        ("NRI_QOS_BIN", "/tmp/nri-qos"),
        ("NRI_QOS_SKIP_UPSTREAM", "1"),
        ("NRI_QOS_PLUGINX_NAME", "y"),
        ("nri_qos_plugin_name", "lower"),
    ]))
    .unwrap();
    assert_eq!(cfg, Config::default());
}

#[test]
fn env_overrides_file_and_validation_catches_bad_values() {
    let mut cfg = Config::from_toml("[plugin]\ndry-run = false\n", Path::new("c.toml")).unwrap();
    cfg.apply_env(env(&[
        ("NRI_QOS_PLUGIN_DRY_RUN", "true"),
        ("NRI_QOS_METRICS_ADDRESS", "0.0.0.0:9464"),
    ]))
    .unwrap();
    assert!(cfg.plugin.dry_run);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("metrics.address"), "{err}");
}

#[test]
fn a_drop_in_overrides_only_the_keys_it_sets() {
    use crate::qos::{Reservation, WeightConversion};
    let base = PolicyConfig {
        memory_reservation: Reservation::Min,
        memory_throttling_factor: 0.8,
        ..Default::default()
    };
    let (p, dry) = layer_drop_in(&base, true, "[policy]\ncpu-weight = \"linear\"\n").unwrap();
    assert_eq!(p.cpu_weight, WeightConversion::Linear);
    assert_eq!(p.memory_reservation, Reservation::Min, "kept from the file");
    assert_eq!(p.memory_throttling_factor, 0.8);
    assert!(dry, "dry-run kept when the drop-in does not say");
    let (_, dry) = layer_drop_in(&base, true, "[plugin]\ndry-run = false\n").unwrap();
    assert!(!dry);
    assert!(
        layer_drop_in(&base, false, "[policy]\ncpu-wieght = \"linear\"\n")
            .unwrap_err()
            .to_string()
            .contains("cpu-wieght")
    );
    assert!(layer_drop_in(&base, false, "[policy]\nmemory-throttling-factor = 7.0\n").is_err());
}

#[derive(clap::Parser)]
struct Wrap {
    #[command(flatten)]
    args: MonitorArgs,
}

#[test]
fn pressure_cli_flags_override_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nri-qos.toml");
    std::fs::write(
        &file,
        "[policy]\n[monitor]\nhard-threshold = \"200Mi\"\ncooldown = \"3s\"\n",
    )
    .unwrap();
    let w = Wrap::try_parse_from([
        "x",
        "--cgroup-root",
        "/tmp/cg",
        "-c",
        file.to_str().unwrap(),
        "--dry-run",
        "--soft-threshold",
        "0",
        "--check-interval",
        "250ms",
    ])
    .unwrap();
    let s = w.args.resolve(std::iter::empty()).unwrap();
    let (cfg, paths) = (s.monitor, s.paths);
    assert_eq!(paths.cgroup_root, PathBuf::from("/tmp/cg"));
    assert_eq!(paths.proc_root, PathBuf::from("/proc"));
    assert!(cfg.dry_run);
    assert_eq!(cfg.hard_threshold, SizeOrPercent::Bytes(200 << 20));
    assert_eq!(cfg.soft_threshold, SizeOrPercent::Bytes(0));
    assert_eq!(cfg.cooldown.to_string(), "3s");
    assert_eq!(cfg.check_interval.to_string(), "250ms");
    assert!(Wrap::try_parse_from(["x", "--hard-threshold", "lots"]).is_err());
    let bad = Wrap::try_parse_from(["x", "-c", "/nonexistent/x.toml"]).unwrap();
    assert!(bad
        .args
        .resolve(std::iter::empty())
        .unwrap_err()
        .to_string()
        .contains("/nonexistent/x.toml"));
}

#[test]
fn monitor_reads_the_environment_and_its_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nri-qos.toml");
    std::fs::write(&file, "[plugin]\nlog-level = \"warn\"\n").unwrap();
    let c = file.to_str().unwrap();
    let vars = || {
        env(&[
            ("NRI_QOS_NODE_CGROUP_ROOT", "/host/cg"),
            ("NRI_QOS_PLUGIN_LOG_LEVEL", "debug"),
        ])
    };
    let s = Wrap::try_parse_from(["x", "-c", c])
        .unwrap()
        .args
        .resolve(vars())
        .unwrap();
    assert_eq!(
        s.paths.cgroup_root,
        Path::new("/host/cg"),
        "env over defaults"
    );
    assert_eq!(s.log_level, "debug", "env over the file");
    assert_eq!(s.log_format, LogFormat::Text);
    let s = Wrap::try_parse_from([
        "x",
        "-c",
        c,
        "--cgroup-root",
        "/cg",
        "--log-level",
        "error",
        "--log-format",
        "json",
    ])
    .unwrap()
    .args
    .resolve(vars())
    .unwrap();
    assert_eq!(s.paths.cgroup_root, Path::new("/cg"), "flags over env");
    assert_eq!(
        (s.log_level.as_str(), s.log_format),
        ("error", LogFormat::Json)
    );
    let err = Wrap::try_parse_from(["x", "-c", c])
        .unwrap()
        .args
        .resolve(env(&[("NRI_QOS_NODE_CGROUP_ROT", "/x")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("NRI_QOS_NODE_CGROUP_ROT"), "{err}");
}

#[test]
fn plugin_layers_end_with_flags_then_the_runtime_given_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nri-qos.toml");
    std::fs::write(&file, "[plugin]\nindex = \"20\"\nlog-level = \"warn\"\n").unwrap();
    let args = RunArgs {
        log_level: Some("debug".into()),
        ..Default::default()
    };
    let vars = || {
        env(&[
            ("NRI_QOS_CONFIG", file.to_str().unwrap()),
            ("NRI_QOS_PLUGIN_INDEX", "30"),
            ("NRI_QOS_PLUGIN_LOG_LEVEL", "info"),
        ])
    };
    let cfg = Config::for_plugin(&args, vars(), &Launch::default()).unwrap();
    assert_eq!(cfg.plugin.index, "30", "env over the file");
    assert_eq!(cfg.plugin.log_level, "debug", "flags over env");
    let named = Launch {
        program: Some("05-qos".into()),
        ..Default::default()
    };
    let cfg = Config::for_plugin(&args, vars(), &named).unwrap();
    assert_eq!(
        (cfg.plugin.name.as_str(), cfg.plugin.index.as_str()),
        ("qos", "05")
    );
    let prelaunched = Launch {
        name: Some("rt".into()),
        index: Some("07".into()),
        ..named
    };
    let cfg = Config::for_plugin(&args, vars(), &prelaunched).unwrap();
    assert_eq!(
        (cfg.plugin.name.as_str(), cfg.plugin.index.as_str()),
        ("rt", "07")
    );
}

/// memory.high is set only where a throttle guard acts on it: the defaults
/// are guarded, the guard off (or only logging) is refused naming both
/// keys, and only an outright `accept` (or no memory.high) passes.
#[test]
fn memory_high_without_a_guard_is_refused_unless_accepted() {
    let load = |text: &str| Config::from_toml(text, Path::new("c.toml")).unwrap();
    assert!(Config::default().check_guarded().is_ok());
    assert!(
        Config::default().plugin.with_monitor,
        "the monitor runs by default"
    );
    assert!(
        Config::default().throttle.enabled,
        "the guard runs by default"
    );
    // The guard runs whatever with-monitor says.
    assert!(load("[plugin]\nwith-monitor = false\n")
        .check_guarded()
        .is_ok());
    type Change = fn(&mut Config);
    let guard_off: [(Change, &str); 3] = [
        (|c| c.throttle.enabled = false, "throttle.enabled = false"),
        (|c| c.throttle.dry_run = true, "throttle.dry-run = true"),
        (|c| c.monitor.dry_run = true, "monitor.dry-run = true"),
    ];
    let fine: [Change; 3] = [
        |c| c.throttle.unguarded_memory_high = crate::guard::UnguardedMemoryHigh::Accept,
        |c| c.policy.memory_high = false,
        |c| c.plugin.dry_run = true,
    ];
    for (off, key) in guard_off {
        let mut cfg = Config::default();
        off(&mut cfg);
        let e = cfg.check_guarded().unwrap_err().to_string();
        assert!(e.contains("policy.memory-high = true"), "{key}: {e}");
        assert!(e.contains(key), "{key}: {e}");
        assert!(
            e.contains("unguarded-memory-high = \"accept\""),
            "{key}: {e}"
        );
        for ok in fine {
            let mut cfg = cfg.clone();
            ok(&mut cfg);
            assert!(cfg.check_guarded().is_ok(), "{key}");
        }
    }
    let e = load("[throttle]\nenabled = false\n[monitor]\ndry-run = true\n")
        .check_guarded()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("throttle.enabled = false and monitor.dry-run = true"),
        "{e}"
    );
    let accepted = "[throttle]\nenabled = false\nunguarded-memory-high = \"accept\"\n";
    assert!(load(accepted).check_guarded().is_ok());
}

/// The same rule at start (the plugin's layers) and for the runtime's
/// drop-in, which may bring its own `[policy]`: refused with the reason,
/// and the plugin keeps what it has.
#[test]
fn the_guard_rule_holds_at_start_and_for_the_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nri-qos.toml");
    std::fs::write(
        &file,
        "[throttle]\nenabled = false\n[policy]\nmemory-high = false\n",
    )
    .unwrap();
    let vars = || env(&[("NRI_QOS_CONFIG", file.to_str().unwrap())]);
    let cfg = Config::for_plugin(&RunArgs::default(), vars(), &Launch::default()).unwrap();
    let layer = drop_in_layer(&cfg);
    let e = layer("[policy]\nmemory-high = true\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("throttle.enabled = false"), "{e}");
    assert!(layer("[policy]\ncpu-weight = \"linear\"\n").is_ok());

    std::fs::write(&file, "[throttle]\nenabled = false\n").unwrap();
    let e = Config::for_plugin(&RunArgs::default(), vars(), &Launch::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.memory-high = true") && e.contains("throttle.enabled = false"),
        "{e}"
    );
}
