//! Notebook-grade rich output: display(), objects' `_repr_*_` methods, matplotlib figures as
//! PNG, pandas DataFrames as text and HTML. Needs matplotlib and pandas in the Python the
//! sandboxes use (`scripts/test` installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use base64::Engine;
use runbox_core::{Backend, RichResult};
use util::*;

/// Width and height of a PNG, checking its signature.
fn png_size(b64: &str) -> (u32, u32) {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

fn mime<'a>(r: &'a RichResult, m: &str) -> Option<&'a str> {
    r.data.get(m).and_then(|v| v.as_str())
}

#[tokio::test]
async fn objects_show_every_representation_they_have() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        r#"
class Card:
    def _repr_html_(self): return "<b>card</b>"
    def _repr_markdown_(self): return "**card**"
    def _repr_json_(self): return {"suit": "hearts", "rank": 12}
    def _repr_svg_(self): return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    def __repr__(self): return "Card(Q of hearts)"
print("before")
display(Card(), "plain text")
print("after")
Card()
"#,
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.stdout, "before\nafter\n");
    assert_eq!(o.results.len(), 3, "{:?}", o.results);
    let shown = &o.results[0];
    assert!(!shown.is_main_result);
    assert_eq!(mime(shown, "text/html"), Some("<b>card</b>"));
    assert_eq!(mime(shown, "text/markdown"), Some("**card**"));
    assert_eq!(shown.data["application/json"]["rank"], 12);
    assert!(mime(shown, "image/svg+xml").unwrap().starts_with("<svg"));
    assert_eq!(mime(shown, "text/plain"), Some("Card(Q of hearts)"));
    assert_eq!(mime(&o.results[1], "text/plain"), Some("'plain text'"));
    let last = &o.results[2];
    assert!(last.is_main_result);
    assert_eq!(mime(last, "text/html"), Some("<b>card</b>"));
    b.close(&id).await.unwrap();
}

/// A display() flood stops at the cap, in the server's memory as in the answer.
#[tokio::test]
async fn endless_displays_stop_at_the_cap() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(&b, &id, "for i in range(1200): display(i)\n'last'").await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.results.len(), runbox_core::capture::MAX_RESULTS + 1);
    assert_eq!(mime(&o.results[999], "text/plain"), Some("999"));
    let last = &o.results[1000];
    assert!(last.is_main_result);
    assert_eq!(mime(last, "text/plain"), Some("'last'"));
    assert!(
        o.notes.iter().any(|n| n.starts_with("200 rich results")),
        "{:?}",
        o.notes
    );
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn a_broken_repr_does_not_lose_the_run() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "class Odd:\n    def _repr_html_(self): raise ValueError('no html')\n    def __repr__(self): return 'Odd()'\nprint('ran')\nOdd()",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.stdout, "ran\n");
    let r = &o.results[0];
    assert_eq!(mime(r, "text/plain"), Some("Odd()"));
    assert!(!r.data.contains_key("text/html"));
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn matplotlib_figures_come_back_as_png() {
    let b = backend().await;
    let id = sandbox(&b).await;
    // A figure left open at the end of a cell is shown, then closed.
    let o = py(
        &b,
        &id,
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3))\nax.plot([1, 4, 9, 16])\nax.set_title('squares')\nNone",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.results.len(), 1, "{:?}", o.results);
    let (w, h) = png_size(mime(&o.results[0], "image/png").expect("a PNG"));
    assert!(w > 100 && h > 100, "{w}x{h}");
    assert!(
        mime(&o.results[0], "text/plain")
            .unwrap()
            .contains("Figure")
    );
    // plt.show() shows each open figure at once, in order with the cell's other output.
    let o = py(
        &b,
        &id,
        "plt.plot([3, 2, 1])\nplt.show()\ndisplay('between')\nplt.figure()\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\nlen(plt.get_fignums())",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    assert_eq!(o.results.len(), 4, "{:?}", o.results);
    png_size(mime(&o.results[0], "image/png").unwrap());
    assert_eq!(mime(&o.results[1], "text/plain"), Some("'between'"));
    png_size(mime(&o.results[2], "image/png").unwrap());
    assert_eq!(
        mime(&o.results[3], "text/plain"),
        Some("0"),
        "every figure is closed once shown"
    );
    b.close(&id).await.unwrap();
}

#[tokio::test]
async fn dataframes_come_back_as_text_and_html() {
    let b = backend().await;
    let id = sandbox(&b).await;
    let o = py(
        &b,
        &id,
        "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0]})\ndf",
    )
    .await;
    assert!(o.succeeded(), "{o:?}");
    let r = &o.results[0];
    assert!(r.is_main_result);
    let html = mime(r, "text/html").expect("html");
    assert!(html.contains("<table") && html.contains("Oslo"), "{html}");
    let text = mime(r, "text/plain").unwrap();
    assert!(text.contains("city") && text.contains("Lima"), "{text}");
    b.close(&id).await.unwrap();
}
