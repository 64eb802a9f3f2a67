from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.routers import DefaultRouter

from webapp.api import views

router = DefaultRouter()
router.register("projects", views.ProjectViewSet, basename="project")
router.register("agents", views.AgentViewSet, basename="agent")
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("rewards", views.RewardFunctionViewSet, basename="reward")
router.register("backends", views.BackendViewSet, basename="backend")
router.register("runs", views.RunViewSet, basename="run")

app_name = "api"
urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("token/", obtain_auth_token, name="token"),
    path("", include(router.urls)),
]
