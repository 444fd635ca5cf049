// Starts Swagger UI on /docs (the page policy forbids inline scripts, so the configuration lives here).
"use strict";

window.addEventListener("DOMContentLoaded", function () {
  const xsrf = document.querySelector('meta[name="xsrf-token"]').content;
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
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
