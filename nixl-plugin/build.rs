//! Compiles the thin C++ layer (cpp/plugin.cpp: the subclass of NIXL's backend engine, over
//! our own declaration of NIXL 1.5.1's ABI in cpp/nixl_abi.h). NIXL's core requires plugins
//! built with C++20 against a compatible libstdc++ (the C++11 string ABI); no NIXL header or
//! library is needed.

fn main() {
    println!("cargo:rerun-if-changed=cpp/plugin.cpp");
    println!("cargo:rerun-if-changed=cpp/nixl_abi.h");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("cpp/plugin.cpp")
        .flag("-fvisibility=hidden")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("ugds_nixl_cpp");
}
