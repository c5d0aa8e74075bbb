(function () {
  "use strict";
  function render(div) {
    var holder = document.getElementById(div.getAttribute("data-spec"));
    var spec = JSON.parse(holder.textContent);
    var opts = {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}};
    return vegaEmbed(div.querySelector(".vis"), spec, opts).then(function () {
      div.setAttribute("data-rendered", "1");
    }).catch(function (err) {
      div.setAttribute("data-rendered", "error");
      div.querySelector(".vis").textContent = "This chart failed to render: " + err;
      console.error("chart " + div.id + " failed:", err);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var charts = Array.prototype.slice.call(document.querySelectorAll("div.chart[data-spec]"));
    Promise.all(charts.map(render)).then(function () {
      document.body.setAttribute("data-charts-done", String(charts.length));
    });
  });
})();
