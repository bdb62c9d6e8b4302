// The one wasmtime `Config` of WASTE, shared by build.rs (which precompiles
// the bundled component with it) and component.rs (which builds the runtime
// `Engine` with it and loads that precompiled component).
//
// The crate declares this file as a module and build.rs `include!`s it, so
// the two configurations cannot drift apart (plain comments here: an
// included file cannot carry inner doc comments).
//
// A precompiled component only loads into an engine whose settings match the ones it was compiled with (wasmtime checks the target,
// the Cranelift flags, the CPU features, the tunables and the wasm features
// at load time and refuses a mismatch); anything that changes here changes
// both sides in the same build.
//
// No target is set: Cranelift infers the native CPU's features, as it does
// for a JIT compile at run time. build.rs precompiles only when the build
// host is also the target (no cross-compilation), so "native" means the
// build machine there; a binary later run on a CPU that lacks one of those
// features fails the load check and falls back to compiling the component
// from its wasm bytes.

/// The configuration of every wasmtime `Engine` that runs (or precompiles)
/// the bundled component.
pub fn engine_config() -> wasmtime::Config {
    wasmtime::Config::new()
}
