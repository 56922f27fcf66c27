// The panel's only script: an optional refresh, remembered in this browser, and a confirmation
// before a form marked data-confirm is sent. Every page works without it.
document.addEventListener("submit", function (e) {
  var button = e.submitter;
  var ask = (button && button.getAttribute("data-confirm")) || e.target.getAttribute("data-confirm");
  if (ask && !window.confirm(ask)) e.preventDefault();
});
(function () {
  var box = document.getElementById("auto-refresh");
  if (!box) return;
  box.checked = localStorage.getItem("onus.refresh") === "on";
  box.addEventListener("change", function () {
    localStorage.setItem("onus.refresh", box.checked ? "on" : "off");
  });
  setInterval(function () {
    if (box.checked && !document.hidden && !document.activeElement.matches("input:not([type=checkbox])")) {
      location.reload();
    }
  }, 5000);
})();
