// Starts Swagger UI on /docs (the page policy forbids inline scripts, so the configuration lives here).
"use strict";

window.addEventListener("DOMContentLoaded", function () {
  const xsrf = document.querySelector('meta[name="xsrf-token"]').content;
  // Each data endpoint is listed once (/social); the /twitter aliases only on request.
  const aliases = new URLSearchParams(location.search).get("aliases") === "true";
  const toggle = document.getElementById("aliases");
  toggle.href = aliases ? "/docs" : "/docs?aliases=true";
  toggle.textContent = aliases ? "Hide the /twitter aliases" : "Also list the /twitter aliases";
  window.ui = SwaggerUIBundle({
    url: "/openapi.json" + (aliases ? "?aliases=true" : ""),
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null, // no calls to an outside validator
    displayRequestDuration: true,
    // The portal's session cookie rides along on same-origin calls: its writes need the XSRF token.
    requestInterceptor: function (request) {
      if ((request.method || "GET").toUpperCase() !== "GET") request.headers["X-XSRFToken"] = xsrf;
      return request;
    },
  });
});
