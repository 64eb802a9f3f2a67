from django.urls import path

from webapp.playground import views

app_name = "playground"
urlpatterns = [
    path("runs/<int:pk>/playground/", views.playground, name="page"),
    path("runs/<int:pk>/playground/ask", views.ask, name="ask"),
    path("playground/<int:pk>.json", views.answer, name="answer"),
]
