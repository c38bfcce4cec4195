//! Finds libllm for linking. No pkg-config and no registry crates: the crate
//! must build offline. Search order:
//!   1. `LLM_LIB_DIR`: a directory holding libllm.so (e.g. the CMake build's `lib/`);
//!   2. `LLM_PREFIX`: an install prefix (`cmake --install --prefix ...`), its lib dirs;
//!   3. the usual system prefixes (/usr/local, /usr).
//!
//! A directory found through 1 or 2 is also put into the rpath of test and
//! example binaries, so `cargo test` runs without LD_LIBRARY_PATH.
use std::env;
use std::path::{Path, PathBuf};

fn has_lib(dir: &Path) -> bool {
    dir.join("libllm.so").exists() || dir.join("libllm.dylib").exists() || dir.join("llm.lib").exists()
}

fn prefix_lib_dirs(prefix: &Path) -> Vec<PathBuf> {
    ["lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"]
        .iter()
        .map(|d| prefix.join(d))
        .collect()
}

fn main() {
    println!("cargo:rerun-if-env-changed=LLM_LIB_DIR");
    println!("cargo:rerun-if-env-changed=LLM_PREFIX");
    println!("cargo:rerun-if-changed=build.rs");

    let mut found: Option<(PathBuf, bool)> = None; // (dir, explicit)
    if let Some(dir) = env::var_os("LLM_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !has_lib(&dir) {
            panic!("LLM_LIB_DIR={} does not contain libllm.so", dir.display());
        }
        found = Some((dir, true));
    }
    if found.is_none() {
        if let Some(prefix) = env::var_os("LLM_PREFIX") {
            let prefix = PathBuf::from(prefix);
            match prefix_lib_dirs(&prefix).into_iter().find(|d| has_lib(d)) {
                Some(dir) => found = Some((dir, true)),
                None => panic!("LLM_PREFIX={} has no lib*/libllm.so", prefix.display()),
            }
        }
    }
    if found.is_none() {
        for prefix in ["/usr/local", "/usr"] {
            if let Some(dir) = prefix_lib_dirs(Path::new(prefix)).into_iter().find(|d| has_lib(d)) {
                found = Some((dir, false));
                break;
            }
        }
    }

    match &found {
        Some((dir, explicit)) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            if *explicit
                && env::var("CARGO_CFG_TARGET_OS")
                    .map(|os| os != "windows")
                    .unwrap_or(true)
            {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            }
            println!("cargo:lib_dir={}", dir.display());
        }
        None => println!(
            "cargo:warning=libllm.so not found; set LLM_LIB_DIR (CMake build lib dir) or LLM_PREFIX (install prefix)"
        ),
    }
    println!("cargo:rustc-link-lib=dylib=llm");
}
