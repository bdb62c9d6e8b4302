/* A stand-in for Windows' bcryptprimitives.dll for wine 8 (Debian
 * bookworm's), which lacks it: Rust's standard library draws its random
 * seeds from ProcessPrng there since Rust 1.78, so no Rust program starts
 * under that wine without it. tests/integration/platforms.rs builds it with
 * MinGW-w64 into the test's wine prefix only when the prefix has none; a
 * newer wine brings its own. Nothing of it ships with WASTE. */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    return BCryptGenRandom(NULL, data, (ULONG)len, BCRYPT_USE_SYSTEM_PREFERRED_RNG) == 0;
}
