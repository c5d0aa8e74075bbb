(function () {
  "use strict";
  // data.js stores each chart's rows column by column (longca.report.assets.encode_rows)
  function decode(enc) {
    var rows = [], i;
    for (i = 0; i < enc.n; i++) rows.push({});
    Object.keys(enc.c).forEach(function (name) {
      var col = enc.c[name];
      for (var j = 0; j < enc.n; j++) {
        var v = Array.isArray(col) ? col[j] : col.d[col.i[j]];
        if (v !== null) rows[j][name] = v;  // absent, not null: a tooltip lists what the row has
      }
    });
    return rows;
  }
  function csv(rows) {
    var cols = [];
    rows.forEach(function (r) { Object.keys(r).forEach(function (k) { if (cols.indexOf(k) < 0) cols.push(k); }); });
    var cell = function (v) {
      if (v === undefined || v === null) return "";
      var s = typeof v === "object" ? JSON.stringify(v) : String(v);
      return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
    };
    return [cols.join(",")].concat(rows.map(function (r) {
      return cols.map(function (k) { return cell(r[k]); }).join(",");
    })).join("\n") + "\n";
  }
  // Downloads made here from the drawn chart and its rows: no file to go missing, works from file://
  function links(div, view, spec, name) {
    var files = div.querySelector(".files");
    if (!files) return;
    var add = function (label, ext, make) {
      var a = document.createElement("a");
      a.textContent = label;
      a.href = "#";
      a.setAttribute("download", name + "." + ext);
      a.addEventListener("click", function (ev) {
        if (a.getAttribute("data-ready")) return;
        ev.preventDefault();
        Promise.resolve(make()).then(function (url) {
          a.href = url;
          a.setAttribute("data-ready", "1");
          a.click();
        });
      });
      files.appendChild(a);
    };
    var blob = function (text, type) { return URL.createObjectURL(new Blob([text], {type: type})); };
    add("SVG", "svg", function () { return view.toImageURL("svg"); });
    add("PNG", "png", function () { return view.toImageURL("png", 2); });
    add("data (CSV)", "csv", function () { return blob(csv(spec.datasets.rows), "text/csv"); });
    add("Vega-Lite spec", "vl.json", function () { return blob(JSON.stringify(spec, null, 1), "application/json"); });
  }
  function render(div) {
    var holder = document.getElementById(div.getAttribute("data-spec"));
    var spec = JSON.parse(holder.textContent);
    var id = div.id.replace(/^chart-/, "");
    spec.datasets = {rows: decode(window.LONGCA_DATA[id])};
    var opts = {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}};
    return vegaEmbed(div.querySelector(".vis"), spec, opts).then(function (result) {
      links(div, result.view, spec, id);
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
