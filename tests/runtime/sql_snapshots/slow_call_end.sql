UPDATE sandbox_slowcall SET finished_at = %s WHERE id = %s
