from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("runs/<int:pk>/", views.dashboard_page, name="run"),
    path("runs/<int:pk>/series.json", views.run_series, name="series"),
    path("runs/<int:pk>/episodes.json", views.run_episodes, name="episodes"),
    path("compare/", views.compare, name="compare"),
    path("compare/series.json", views.compare_series, name="compare_series"),
    path("compare/series.bin", views.compare_series_packed, name="compare_series_packed"),
    path("plotly.min.js", views.plotly_js, name="plotly"),
]
