// The panel's only script: an optional refresh, remembered in this browser, and a confirmation
// before a form marked data-confirm is sent. Every page works without it.
document.addEventListener("submit", function (e) {
  var button = e.submitter;
  var ask = (button && button.getAttribute("data-confirm")) || e.target.getAttribute("data-confirm");
  if (ask && !window.confirm(ask)) e.preventDefault();
});
// Names each table cell after its column (data-label), which narrow screens show beside the
// value when they stack a row's cells; a header that is only for screen readers names nothing.
function labelCells(root) {
  root.querySelectorAll("table").forEach(function (table) {
    var names = Array.from(table.querySelectorAll("thead th")).map(function (th) {
      return th.querySelector(".sr") ? "" : th.textContent.trim();
    });
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      Array.from(tr.children).forEach(function (td, i) {
        if (!td.hasAttribute("data-label") && names[i] !== undefined) td.setAttribute("data-label", names[i]);
      });
    });
  });
}
labelCells(document);
(function () {
  var box = document.getElementById("auto-refresh");
  if (!box) return;
  box.parentElement.hidden = false;
  box.checked = localStorage.getItem("onus.refresh") === "on";
  box.addEventListener("change", function () {
    localStorage.setItem("onus.refresh", box.checked ? "on" : "off");
  });
  var busy = false;
  // Fetches this page again and swaps in its content and the alert badge, without a reload.
  function refresh() {
    if (busy || !box.checked || document.hidden) return;
    // Not while something in the page has the keyboard's focus: swapping it would lose it.
    var active = document.activeElement, main = document.querySelector("main");
    if (active && active !== document.body && main && main.contains(active)) return;
    if (active && active.matches("input:not([type=checkbox]), select, textarea")) return;
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        // An expired session is sent to the login page: go there (never a reload, which could
        // send a form again). A page that is not there to fetch (the answer to a form) or an
        // error is left as it is.
        if (res.redirected) { location.assign(res.url); return null; }
        if (!res.ok) return null;
        return res.text();
      })
      .then(function (text) {
        if (text === null) return;
        var next = new DOMParser().parseFromString(text, "text/html");
        ["main", "nav[aria-label=Main]"].forEach(function (sel) {
          var now = document.querySelector(sel), then = next.querySelector(sel);
          if (now && then) now.replaceChildren.apply(now, Array.from(then.childNodes));
        });
        labelCells(document);
        document.documentElement.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .finally(function () { busy = false; });
  }
  setInterval(refresh, 5000);
})();
