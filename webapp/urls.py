from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from webapp.health import healthz
from webapp.teams.views import LoginView

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("dashboard/", include("webapp.dashboard.urls")),
    path("", include("webapp.checkpoints.urls")),  # before the API's router: its run and project paths go deeper
    path("api/", include("webapp.api.urls")),
    path("fleet/", include("webapp.fleet.urls")),
    path("", include("webapp.teams.urls")),
    path("", include("webapp.registry.urls")),
    path("", include("webapp.integrations.urls")),
    path("", include("webapp.sweeps.urls")),
    path("", include("webapp.playground.urls")),
    path("", include("webapp.dashboard.run_urls")),
]
