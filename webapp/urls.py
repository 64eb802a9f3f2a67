from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from webapp.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("dashboard/", include("webapp.dashboard.urls")),
    path("api/", include("webapp.api.urls")),
    path("fleet/", include("webapp.fleet.urls")),
    path("", include("webapp.teams.urls")),
    path("", include("webapp.runs.urls")),
]
