DELETE FROM kombu_message WHERE visible = 0
