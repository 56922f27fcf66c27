// The panel's only script: an optional refresh, remembered in this browser. Every page works
// without it.
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
