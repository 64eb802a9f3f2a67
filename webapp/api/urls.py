from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from webapp.api import views
from webapp.api.monitors import MonitorRuleViewSet
from webapp.api.sweeps import SweepViewSet
from webapp.api.token_view import ObtainExpiringToken

router = DefaultRouter()
router.register("projects", views.ProjectViewSet, basename="project")
router.register("agents", views.AgentViewSet, basename="agent")
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("models", views.ModelViewSet, basename="model")
router.register("rewards", views.RewardFunctionViewSet, basename="reward")
router.register("backends", views.BackendViewSet, basename="backend")
router.register("runs", views.RunViewSet, basename="run")
router.register("sweeps", SweepViewSet, basename="sweep")
router.register("monitor-rules", MonitorRuleViewSet, basename="monitor-rule")

app_name = "api"
urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path("token/", ObtainExpiringToken.as_view(), name="token"),
    path("", include(router.urls)),
]
