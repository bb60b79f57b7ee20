//! Every struct of `src/abi.rs` against the system's `<infiniband/verbs.h>`: a C program
//! compiled here prints each struct's size and each field's offset, and each must equal Rust's.
#[allow(dead_code, non_camel_case_types, clippy::all)]
#[path = "../src/abi.rs"]
mod abi;
#[allow(dead_code, non_camel_case_types, clippy::all)]
#[path = "../src/rdmacm/abi.rs"]
mod rdma_abi;

use std::mem::{offset_of, size_of};
use std::process::Command;

fn table() -> Vec<(&'static str, usize)> {
    let verbs: &[(&str, usize)] = include!("support/layout_table.rs");
    let rdmacm: &[(&str, usize)] = include!("support/layout_table_rdmacm.rs");
    verbs.iter().chain(rdmacm).copied().collect()
}

#[test]
fn structs_match_the_system_header() {
    let t = table();
    let dir = std::env::temp_dir().join(format!("rocemu-ibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _) in &t {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc (the layout test needs a C compiler and libibverbs-dev's headers)");
    assert!(st.success(), "the layout program did not compile");
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let c_values: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(c_values.len(), t.len());
    let bad: Vec<String> = t
        .iter()
        .zip(&c_values)
        .filter(|((_, r), c)| r != *c)
        .map(|((e, r), c)| format!("{e}: C {c}, Rust {r}"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "layout differs:\n{}", bad.join("\n"));
    assert!(t.len() > 300, "the table checks {} values", t.len());
}
